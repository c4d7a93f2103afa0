"""The whole image as one file: an array (or an OME-Zarr pyramid) as a virtual tiled
OME-TIFF (`WholeImage`), and which of them a directory shows (`plan_whole_images`).

A `WholeImage` ties the parts: where everything is (`layout.py`), its header
(`header.py`, the IFDs, with the OME-XML of `ome.py`), its tiles (`tiles.py`) and
what is put ahead of its reader (`push.py`); it decides per level whether stored
chunks pass through (the header's byte counts), and answers reads. No FUSE and no
store listing here: it is planned from metadata alone, and its bytes are produced
on demand from the array views' chunks. The threads it uses (`ImageWorkers`) are
its owner's (the view's), passed in.

- Passthrough tiles (`passthrough_compression`): the stored chunk stream as
  is, when a TIFF compression reads it. The slot is the codec's worst-case
  size; the header's byte counts come from the stored sizes (a local store's
  file sizes or a shard index), looked up when the header is first read
  (uncompressed chunks in local files: the tile size, nothing looked up).
  A local chunk file is read by range, straight from the file.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zfuse.stats import Stats
from zfuse.view.ome_zarr import MULTISCALE_LEVELS_MAX, channels_of, ome_axes
from zfuse.view.tiff import tiff_unsupported_reason
from zfuse.view.tiff_ifd import COMPRESSION_NONE
from zfuse.view.whole_image.file import ImageFile
from zfuse.view.whole_image.header import Counts, render
from zfuse.view.whole_image.layout import (
    COMPRESSION_NAMES,
    FileLayout,
    Level,
    plan_level,
    pyramid_levels,
)
from zfuse.view.whole_image.ome import (
    multiscale_count,
    multiscale_name,
    multiscale_paths,
    ome_xml,
    omero_channels,
)
from zfuse.view.whole_image.push import Pusher, ReadAheadAdvisor
from zfuse.view.whole_image.slide import SLIDE_NAME, SlideLayout, fit_tiles, plan_slide
from zfuse.view.whole_image.strips import STRIPPED_NAME, StrippedImage
from zfuse.view.whole_image.tiles import TileDecoders, Tiles

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView

log = logging.getLogger("zfuse.view.image")

IMAGE_NAME = "image.ome.tif"  # in every array directory
PYRAMID_NAME = "pyramid.ome.tif"  # in every OME-Zarr multiscale group directory
NAMES = (IMAGE_NAME, STRIPPED_NAME, PYRAMID_NAME, SLIDE_NAME)

# A header up to this size is built once and kept; a bigger one (an image of millions
# of tiles: 16 bytes of offset and count per tile) is rendered per read, only the
# bytes read, so the daemon's memory never follows the number of tiles.
_HEADER_KEPT = 4 * 1024**2

_SERIALS = itertools.count(1)
# zeros after each tile of slide.tif: half the default read-ahead window (zfuse's
# read_ahead_kb=1024), what the kernel reads around a page fault on each side
_SLIDE_PADDING = 512 * 1024


def _padded(slot: int, zeros: int) -> int:
    """A tile slot of `slot` bytes followed by at least `zeros` bytes of zeros, both in
    whole pages."""
    return -(-slot // 4096) * 4096 + -(-zeros // 4096) * 4096


class ImageWorkers:
    """The threads whole-image files use: one asking the OS to read chunk files ahead,
    two decoding the further tiles of one read. Started on first use; owned by the
    view that plans the files (`close`, or dropping it, ends them)."""

    def __init__(self) -> None:
        self.advisor = ReadAheadAdvisor()
        self.decoders = TileDecoders(2)

    def close(self) -> None:
        self.advisor.close()
        self.decoders.close()


class WholeImage(ImageFile):
    """A virtual tiled (Big)TIFF of one array, or of a pyramid of arrays (SubIFDs).

    `size` and the tile slots come from metadata alone. `read_cached` answers
    from memory only; `read` may decode (call it from a worker thread).
    """

    def __init__(
        self,
        name: str,
        levels: Sequence[ArrayView],
        ome: dict[str, Any] | None = None,
        channels: list[dict[str, Any]] | None = None,
        stats: Stats | None = None,
        label: str = "",
        title: str = "",
        *,
        workers: ImageWorkers,
        slide: SlideLayout | None = None,
    ) -> None:
        """`label`: the directory's path, for log lines; `title`: the OME Image Name (the
        multiscale's name, else the directory's); `workers`: the owner's threads;
        `slide`: the OpenSlide layout (levels as successive IFDs, RGB interleaved where
        there are 3 samples, no OME-XML) instead of the OME-TIFF one."""
        if not levels:
            raise ValueError("a whole-image file needs at least one array")
        self.name = name
        # why a pyramid has fewer levels than its multiscale (`zfuse info` says it)
        self.levels_note: str | None = None
        self.label = label or name
        self._serial = next(_SERIALS)  # never reused, unlike id()
        self.stats = stats or levels[0].stats or Stats()
        first = levels[0].source
        self.dtype = np.dtype(first.dtype)
        reason = tiff_unsupported_reason(self.dtype)
        if reason is not None:
            raise ValueError(reason)
        planned = [plan_level(a) for a in levels]
        # the image's shape and axes in its own order (`ImageAxes`: rows and columns last)
        self.shape = tuple(planned[0].axes.permute(first.shape))
        ome = planned[0].axes.ome(ome)
        samples = 1
        # over a remote store any byte of a tile costs fetching its whole chunk
        remote = any(getattr(lv.array, "fetches_remotely", False) for lv in planned)
        if slide is not None:
            samples = slide.samples
            fit_tiles(planned)
            for lv in planned:
                lv.tile_bytes = lv.slot = lv.tile_bytes * samples  # interleaved samples
                # OpenSlide reads tiles through libtiff's map of the file, and the kernel
                # reads a page fault's surroundings (up to half the read-ahead window on
                # either side): zeros there, not the neighbouring tiles, so a region
                # decodes only its own tiles' chunks
                lv.slot = _padded(lv.slot, _SLIDE_PADDING)
            self.is_ome = False
            self.layout = FileLayout(planned, b"", successive=True, samples=samples, resolutions=slide.resolutions)
            if self.layout.planes != 1:
                raise ValueError("an OpenSlide file holds one plane")
        else:
            xml = ome_xml(title or label or name, self.shape, self.dtype, ome, channels)
            # no OME pixel type: tifffile's "shaped" description keeps the array's shape
            text = xml if xml is not None else json.dumps({"shape": list(self.shape)})
            self.is_ome = xml is not None
            if remote:
                # the kernel's read-ahead past a region's last tile in a row reads zeros,
                # not the next tiles: each of those would be a chunk fetched that the
                # region does not cover. Two windows: a window read ahead asynchronously
                # starts where the one before it ended (GDAL's reads set that off)
                pad = 2 * max(levels[0].options.read_ahead_bytes, 0)
                for lv in planned:
                    lv.slot = _padded(lv.slot, pad)
            self.layout = FileLayout(planned, text.encode("utf-8") + b"\0")
        self._header: bytes | None = None
        self._header_lock = threading.Lock()
        self._counts: list[Counts] | None = None  # byte counts per level (planes * tiles)
        self._modes: list[int | None] | None = None  # compression per level after the header
        self._changes: tuple[int, ...] = ()
        self._failed: str | None = None  # why this file is stale (reopen)
        self._tiles = Tiles(planned, self.dtype, self.stats, self.label, workers.decoders, self.invalidate,
                            samples)
        # over a remote store a pushed tile is a request: only what the reader's pattern shows
        # (the tiles it pushes are pushed one after another: their chunks are fetched first,
        # side by side, not one round trip each)
        self._push = Pusher(self.layout, self._tile_byte_count, self._change_marks, workers.advisor, remote,
                            fetch_ahead=self._tiles.fetch_ahead)
        # OpenSlide reads what a region covers, through a map of the file: nothing pushed
        self._pushes = slide is None

    # -- where things are (the layout's) -------------------------------------------------
    @property
    def levels(self) -> list[Level]:
        return self.layout.levels

    @property
    def planes(self) -> int:
        return self.layout.planes

    @property
    def description(self) -> bytes:
        return self.layout.description

    @property
    def bigtiff(self) -> bool:
        return self.layout.bigtiff

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def header_size(self) -> int:
        return self.layout.header_size

    @property
    def data_start(self) -> int:
        return self.layout.data_start

    def slot_offset(self, level: int, plane: int, tile: int) -> int:
        return self.layout.slot_offset(level, plane, tile)

    # -- description for `zfuse info` -------------------------------------------------
    @property
    def tiles(self) -> int:
        return self.layout.tiles

    def modes(self) -> list[str]:
        """Per level: "decoded" or "passthrough (<compression>)" (as planned, or as built)."""
        out = []
        for k, lv in enumerate(self.levels):
            mode = lv.passthrough[0] if lv.passthrough is not None else None
            if self._modes is not None:
                mode = self._modes[k]
            out.append("decoded" if mode is None else f"passthrough ({COMPRESSION_NAMES[mode]})")
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "bigtiff": self.bigtiff,
            "levels": len(self.levels),
            "planes": self.planes,
            "tiles": self.tiles,
            "tile_shape": [[lv.tile_h, lv.tile_w] for lv in self.levels],
            "level_shapes": [list(lv.array.source.shape) for lv in self.levels],
            "mode": self.modes(),
            "ome": self.is_ome,
            **({"levels_note": self.levels_note} if self.levels_note else {}),
        }

    # -- staleness ---------------------------------------------------------------------
    @property
    def version(self) -> tuple[int, tuple[int, ...]]:
        """Changes when the bytes may have: another file object, or a chunk of its
        arrays written through the view (the adapter keeps the kernel's page cache
        of the file across opens only while this is unchanged)."""
        return self._serial, self._change_marks()

    def _change_marks(self) -> tuple[int, ...]:
        return tuple(lv.array.data_version for lv in self.levels)

    @property
    def stale(self) -> bool:
        """Whether a new file must be planned: the byte counts in a built passthrough
        header no longer match the store (a write through the mount, or a mismatch seen)."""
        if self._failed is not None:
            return True
        if self._modes is None or not any(m is not None for m in self._modes):
            return False
        return self._change_marks() != self._changes

    def same_layout(self, other: WholeImage) -> bool:
        """Whether `other` has byte-for-byte the same header (blocking: may look up the
        stored sizes of both). Compared by what the header is made of, not its bytes:
        the header of a big image is never built whole."""
        if self.size != other.size or self.bigtiff != other.bigtiff:
            return False
        self.settle()
        other.settle()
        return self._layout_key() == other._layout_key()

    def _layout_key(self) -> tuple[Any, ...]:
        """Everything the header's bytes are a function of."""
        levels = tuple((lv.width, lv.height, lv.tile_w, lv.tile_h, lv.slot, lv.data_start) for lv in self.levels)
        return (self.bigtiff, self.header_size, self.description, self.dtype.str, self.planes, levels,
                tuple(self._modes or ()), tuple(self._counts or ()))

    # -- the header --------------------------------------------------------------------
    def settle(self) -> None:
        """Decide passthrough or decoded per level, and the byte counts (blocking for
        passthrough levels: looks up stored sizes once)."""
        if self._modes is not None:
            return
        with self._header_lock:
            if self._modes is None:
                marks = self._change_marks()
                counts, modes = self._byte_counts()
                self._counts, self._changes = counts, marks
                self._modes = modes  # last: `_modes` set means the counts are there

    def header(self) -> bytes:
        """Every IFD with its tile offsets and byte counts, the whole header as one
        bytes object (blocking for passthrough levels: looks up stored sizes once).
        Kept when it is at most `_HEADER_KEPT`; reads of a bigger one render only
        the bytes they cover (`header_bytes`)."""
        header = self._header
        if header is not None:
            return header
        self.settle()
        header = self._render(0, self.header_size)
        if self.header_size <= _HEADER_KEPT:
            self._header = header
        return header

    def header_bytes(self, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the header (blocking, as `header`)."""
        if self._header is not None:
            return self._header[start:stop]
        if self.header_size <= _HEADER_KEPT:
            return self.header()[start:stop]
        self.settle()
        return self._render(start, stop)

    def _byte_counts(self) -> tuple[list[Counts], list[int | None]]:
        counts: list[Counts] = []
        modes: list[int | None] = []
        for lv in self.levels:
            mode = None
            level_counts = Counts(lv.tile_bytes)
            if lv.passthrough is not None and self._unchecked_sizes(lv):
                # Every well-formed stored chunk is exactly one tile: no size to look up
                # (a chunk file of another size is served decoded, see _stored_piece).
                mode = COMPRESSION_NONE
            elif lv.passthrough is not None:
                stored = self._stored_counts(lv)
                if stored is not None:
                    level_counts, mode = stored, lv.passthrough[0]
            counts.append(level_counts)
            modes.append(mode)
        return counts, modes

    def _unchecked_sizes(self, lv: Level) -> bool:
        """Uncompressed passthrough from local chunk files without checksums: the byte
        counts are the tile size, known without looking at the store."""
        return (lv.passthrough == (COMPRESSION_NONE, 0)
                and lv.chunk_file((0,) * len(lv.array.source.shape)) is not None)

    def _stored_counts(self, lv: Level) -> Counts | None:
        """Byte counts of a passthrough level from the stored sizes, or None (decoded).
        One entry per stored chunk; tiles with no stored chunk hold the fill tile."""
        assert lv.passthrough is not None
        compression, trailer = lv.passthrough
        src = lv.array.source
        sizes = src.stored_sizes()
        if sizes is None:
            return None  # sizes not cheap here (e.g. an object store without shards)
        fill = len(self._tiles.fill_stream(lv, compression))
        indexes = lv.tile_indexes(sizes.coords)  # (-1: no tile of the level is that chunk)
        mine = indexes >= 0
        indexes, stored = indexes[mine], sizes.sizes[mine]
        values = stored - trailer
        bad = (values < 0) | (values > lv.slot)
        if compression == COMPRESSION_NONE:
            bad |= values != lv.tile_bytes
        if bad.any():
            first = int(np.argmax(bad))
            coords = tuple(int(c) for c in sizes.coords[mine][first])
            log.info("%s: stored chunk %s of %s has %d bytes, outside the tile slot: "
                     "the level is served decoded", self.label, coords, src.name, int(stored[first]))
            return None
        return Counts(fill, indexes, values)

    def _render(self, start: int, stop: int) -> bytes:
        assert self._modes is not None and self._counts is not None
        return render(self.layout, self.dtype, self._modes, self._counts, start, stop)

    # -- tiles pushed ahead of a region reader (`push.py`) ---------------------------------
    def pushes_after(self, offset: int, size: int) -> list[tuple[int, int]]:
        """Byte ranges (offset, length) worth storing in the kernel's page cache ahead of
        the reader, nearest first, after the kernel asked for [offset, offset+size)
        (`Pusher.pushes_after`)."""
        if not self._pushes:
            return []
        return self._push.pushes_after(offset, size)

    @property
    def pushes_before_read(self) -> bool:
        """Whether `pushes_after` is asked before the read it follows is served: over a
        remote store the tiles it predicts are then fetched beside that read's own, not
        a round trip after it (the prediction needs the offset only)."""
        return self._pushes and self._push.remote

    def push_wanted(self, offset: int) -> bool:
        """Whether the tile at `offset` is still worth pushing (`Pusher.push_wanted`)."""
        return self._push.push_wanted(offset)

    def _tile_byte_count(self, level: int, plane: int, tile: int) -> int | None:
        """A tile's bytes in its slot; None while a passthrough level's are not known."""
        lv = self.levels[level]
        count = lv.tile_bytes
        if lv.passthrough is not None:
            if self._modes is None or self._counts is None:
                return None
            if self._modes[level] is not None:
                count = self._counts[level].at(plane * lv.tiles + tile)
        return count

    # -- bytes -------------------------------------------------------------------------

    def _read(self, offset: int, size: int, *, blocking: bool) -> bytes | bytearray | memoryview | None:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        # A read of more than one piece (header and tiles, or two tiles: the kernel's
        # read-ahead asks for 1 MiB) is put together in one buffer, the chunk files
        # read straight into it: no copy of each piece, then of the whole.
        out: memoryview | None = None
        single: bytes | memoryview | None = None
        touched: list[tuple[int, int, int]] = []  # tiles read from the store
        if blocking and end - offset > self.levels[-1].slot:
            further = self.layout.tiles_in(offset, end - offset)[1:]
            if further:
                self.settle()
                assert self._modes is not None
                self._tiles.decode_side_by_side(further, self._modes)
        pos = offset
        if pos < self.data_start:
            if self._header is None and not blocking and self._modes is None:
                return None  # the byte counts are not settled yet
            stop = min(end, self.data_start)
            piece = self.header_bytes(pos, stop)  # settled: memory work only
            if stop == end and len(piece) == stop - pos:
                return piece
            out = memoryview(bytearray(end - offset))
            out[: len(piece)] = piece  # the rest: alignment padding and the gap, zeros
            pos = stop
        while pos < end:
            found = self.layout.locate(pos)
            if found is None:
                break  # past the last slot: the trailer's zeros
            level, plane, tile, within = found
            lv = self.levels[level]
            stop = min(end, pos - within + lv.slot)
            if out is None and stop < end:
                out = memoryview(bytearray(end - offset))
            target = out[pos - offset : stop - offset] if out is not None else None
            count = self._tile_byte_count(level, plane, tile)
            if count is not None and within >= count:  # the slot's zeros past the tile: nothing to decode
                if target is None:
                    single = bytes(stop - pos)
                else:
                    target[:] = bytes(stop - pos)
                pos = stop
                continue
            if self._modes is None and self.levels[level].passthrough is not None:
                if not blocking:
                    return None  # the header decides whether this level passes through
                self.settle()
            piece = None
            if blocking:
                piece = self._tiles.stored_piece(level, plane, tile, within, stop - pos, target,
                                                 self._modes, self._counts)
                touched.append((level, plane, tile))
            if piece is None:
                data = self._tile(level, plane, tile) if blocking else self._tiles.from_memory(level, plane, tile,
                                                                                               self._modes)
                if data is None:
                    return None
                piece = data[within : stop - pos + within]  # a view of a cached chunk: no copy
            if target is None:
                single = piece
                if len(piece) < stop - pos:  # rest of the slot: zeros
                    single = bytes(piece) + bytes(stop - pos - len(piece))
            elif not (isinstance(piece, memoryview) and piece.obj is target.obj):  # not read into it
                target[: len(piece)] = piece
            pos = stop
        for key in touched:  # after these reads: the disk serves them first
            self._push.read_ahead(*key)
        if out is not None:
            return out.obj  # type: ignore[return-value]
        return single if single is not None else bytes(end - offset)

    def _tile(self, level: int, plane: int, tile: int) -> bytes:
        """A tile's stored bytes (passthrough stream, or decoded pixels) (blocking)."""
        self.settle()  # decides passthrough per level (and checks the store once)
        assert self._modes is not None and self._counts is not None
        return self._tiles.tile(level, plane, tile, self._modes, self._counts)


# -- which files a directory shows --------------------------------------------------


def _image_title(path: tuple[str, ...], image: dict[str, Any] | None) -> str:
    """The OME Image Name of an array's image.ome.tif: a level of a named multiscale is
    the multiscale's name and the level, its place in the multiscale ("cells, level 0",
    whatever its path: `s0`, ngff-zarr's `scale0/cells`), else the array's name."""
    if not path:
        return "image"
    if image and image.get("name"):
        return f"{image['name']}, level {image['level']}"
    return path[-1]


def _with_axes(ome: dict[str, Any] | None, array: ArrayView) -> dict[str, Any] | None:
    """OME-Zarr axis metadata with the axis names the array's chunk files follow where it
    has none (no multiscale, or one of OME-Zarr 0.1-0.3, before axes: its dimension
    names or guessed RGB y, x, c; an RGB image's channels were labelled Z)."""
    if (ome is None or not ome.get("axes")) and array.axes is not None:
        return {**(ome or {}), "axes": array.axes}
    return ome


def plan_whole_images(path: tuple[str, ...], node: Any, parent: Any | None,
                      not_shown: dict[str, str] | None = None, *,
                      workers: ImageWorkers) -> dict[str, WholeImage | StrippedImage]:
    """`image.ome.tif` (and `image.tif`, the stripped file for ImageJ 1.x, where ImageJ
    can hold the image) for an array, `pyramid.ome.tif` for an OME-Zarr multiscale group
    (and `slide.tif`, the OpenSlide layout, where OpenSlide can show it).

    `node`/`parent` are the view tree's group/array nodes (kind, children, array,
    metadata). Planned from metadata alone. A file that cannot be planned (an image
    no TIFF can express: wider than a LONG, or a file past 2**63 - 1 bytes) is left
    out, its directory shown as usual, and why is put in `not_shown` (by the
    directory's path). `workers`: the threads the files use (the caller's)."""
    label = "/".join(path) or "/"
    out: dict[str, WholeImage | StrippedImage] = {}
    try:
        if node.array is not None and node.array.layout is not None and 0 in node.array.source.shape:
            # no TIFF has an image 0 pixels wide (tifffile divides by it), nor a level of one
            if not_shown is not None:
                not_shown[label] = f"no whole-image file: the array is empty (shape {tuple(node.array.source.shape)})"
        elif node.array is not None and node.array.layout is not None:
            attrs = _node_attrs(parent) if parent is not None and path else {}
            # the array's own OME axes: the multiscale naming it may be further up
            # (ngff-zarr's scale0/image), and so may its channels' names and colours
            ome = _with_axes(node.array.ome or (ome_axes(attrs, path[-1]) if path else None), node.array)
            image = (ome or {}).get("image")
            channels = channels_of(image["omero"]) if image else omero_channels(attrs)
            out[IMAGE_NAME] = WholeImage(IMAGE_NAME, [node.array], ome, channels, label=label,
                                         title=_image_title(path, image), workers=workers)
            try:
                out[STRIPPED_NAME] = StrippedImage(STRIPPED_NAME, node.array, ome, channels, label=label)
            except ValueError as e:  # too big for ImageJ 1.x, or no ImageJ type: image.ome.tif only
                log.debug("%s: no %s: %s", label, STRIPPED_NAME, e)
                if not_shown is not None:  # (`zfuse info` says why)
                    not_shown["/".join((*path, STRIPPED_NAME))] = str(e)
            except Exception as e:  # never lose image.ome.tif over it
                log.warning("%s: no %s: %s", label, STRIPPED_NAME, e)
        elif node.kind == "group" and not node.has_member(PYRAMID_NAME):
            attrs = _node_attrs(node)
            paths = pyramid_dataset_paths(node)  # (at most MULTISCALE_LEVELS_MAX: a crafted list of thousands)
            count = multiscale_count(attrs)
            if paths and count > 1:
                log.info("%s: %s shows the first of the group's %d multiscales; the others' levels have "
                         "their own %s", label, PYRAMID_NAME, count, IMAGE_NAME)
            arrays = [_descend(node, p) for p in paths]
            missing = [p for p, a in zip(paths, arrays, strict=True)
                       if a is None or a.layout is None or 0 in a.source.shape]
            if missing and not_shown is not None:
                # (`zfuse info` says why a multiscale group has no pyramid file)
                not_shown[label] = (f"no {PYRAMID_NAME}: multiscale dataset {missing[0]!r} is not an array "
                                    "with chunk files and pixels here" + (f" (and {len(missing) - 1} more)" if missing[1:] else ""))
                log.info("%s: %s", label, not_shown[label])
            if arrays and not missing:
                levels, stopped = pyramid_levels(arrays, label)  # type: ignore[arg-type]
                out[PYRAMID_NAME] = WholeImage(PYRAMID_NAME, levels,
                                               _with_axes(levels[0].ome, levels[0]),  # type: ignore[index]
                                               omero_channels(attrs), label=label,
                                               title=multiscale_name(attrs) or (path[-1] if path else "image"),
                                               workers=workers)
                out[PYRAMID_NAME].levels_note = stopped
                if not node.has_member(SLIDE_NAME):
                    try:
                        slide = plan_slide(levels, paths, attrs, label)  # type: ignore[arg-type]
                        if slide is not None:
                            out[SLIDE_NAME] = WholeImage(SLIDE_NAME, levels, label=label, workers=workers,
                                                         slide=slide)
                    except Exception as e:  # never lose pyramid.ome.tif over it
                        log.warning("%s: no %s: %s", label, SLIDE_NAME, e)
    except Exception as e:  # a whole-image file is an extra: never lose the directory over it
        log.warning("%s: no whole-image file: %s", label, e)
        if not_shown is not None:
            not_shown[label] = str(e)
    return out


def pyramid_dataset_paths(node: Any) -> list[str]:
    """The dataset paths a group's pyramid file is planned from (what planning looks up
    below the group: `tree.View` checks they are in memory before planning on a loop)."""
    return (multiscale_paths(_node_attrs(node)) or [])[:MULTISCALE_LEVELS_MAX]


def _node_attrs(node: Any) -> dict[str, Any]:
    try:
        return dict(json.loads(node.metadata).get("attributes") or {})
    except (ValueError, AttributeError):
        return {}


def _descend(node: Any, rel: str) -> ArrayView | None:
    for name in rel.strip("/").split("/"):
        child = node.member(name)
        if child is None:
            return None
        node = child
    return node.array

