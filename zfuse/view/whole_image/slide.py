"""The OpenSlide form of an OME-Zarr pyramid: `slide.tif` in the multiscale group
directory, beside `pyramid.ome.tif`.

OpenSlide reads a pyramid as a "generic tiled TIFF": tiled top-level IFDs one
after another, the first full size, each further one marked reduced-resolution
(NewSubfileType 1); it does not follow SubIFDs. It shows 8-bit images, so
`slide.tif` is made for pyramids of uint8 whose leading axes are one plane
(grayscale) or exactly three channels (an OME-Zarr axis of type `channel` or
named `c`, size 3: RGB, written interleaved, PlanarConfiguration 1, each tile
put together from the three planes' chunks when read). Every tile is decoded,
uncompressed, of one shape for all levels (`fit_tiles` says why). Its microns per pixel
(`openslide.mpp-x`/`-y`) come from XResolution/YResolution in pixels per
centimetre (ResolutionUnit 3), written from each level's OME-Zarr scale where
the axes have a length unit.

This module decides whether a pyramid gets one and what its IFDs say
(`plan_slide`); `WholeImage` (with `FileLayout(successive=True)`) serves it. No
FUSE, no reading.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zfuse.view.ome_zarr import axis_role, ome_datasets
from zfuse.view.tiff_meta import _rational
from zfuse.view.units import micrometres
from zfuse.view.whole_image.layout import ImageAxes, Level

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView

log = logging.getLogger("zfuse.view.image")

SLIDE_NAME = "slide.tif"  # in OME-Zarr multiscale groups of uint8 grayscale or RGB


@dataclass(frozen=True)
class SlideLayout:
    """What an OpenSlide file's IFDs say beyond the levels: samples per pixel (1 or 3)
    and, per level, X/YResolution in pixels per centimetre (num, den, num, den) or None."""

    samples: int
    resolutions: tuple[tuple[int, int, int, int] | None, ...]


_SLIDE_TILE_MAX = 256


def fit_tiles(levels: Sequence[Level]) -> None:
    """One tile shape for every level, its edges multiples of 32, every tile decoded
    and uncompressed, so every tile of the file has the same byte count. The libtiff
    of openslide-bin 4.0 reads a level's tiles with the byte counts of the level read
    before it ("Invalid tile byte count ... Expected 20480, got 65536" reading level 1
    after level 0, for files tifffile writes as well) and fails on 8-bit tiles 16 but
    not 32 apart. The shape is level 0's, rounded down (at least 32) and at most
    256 x 256: a tile overlaps at most two of level 0's chunks per axis; smaller
    levels' edge tiles reach past the image (TIFF allows it; OpenSlide reads only
    the image). libvips (8.14.2 on) refuses a level whose tile edge passes twice its
    larger side rounded up to 256 ("tile size out of range"): 256 always passes."""
    th, tw = (max(32, min(_SLIDE_TILE_MAX, edge) // 32 * 32) for edge in (levels[0].tile_h, levels[0].tile_w))
    for lv in levels:
        itemsize = np.dtype(lv.array.source.dtype).itemsize
        lv.tile_h, lv.tile_w = th, tw
        lv.tiles_down, lv.tiles_across = -(-lv.height // th), -(-lv.width // tw)
        lv.tile_bytes = lv.slot = th * tw * itemsize
        lv.passthrough = None


def _channel_axis(ome: dict[str, Any] | None, ndim: int) -> int | None:
    """The leading axis OME-Zarr names as channel, if one does."""
    if not ome:
        return None
    names = ome.get("axes") or [None] * ndim
    kinds = ome.get("axis_types") or [None] * ndim
    if len(names) != ndim or len(kinds) != ndim:
        return None
    for i in range(max(ndim - 2, 0)):
        if axis_role(names[i], kinds[i]) == "c":
            return i
    return None


def microns_per_pixel(ome: dict[str, Any] | None, ndim: int) -> tuple[float, float] | None:
    """(x, y) microns per pixel from OME-Zarr scales and units, when both axes have them."""
    if not ome or ndim < 2:
        return None
    scales, units = ome.get("scales"), ome.get("units")
    if not isinstance(scales, list) or not isinstance(units, list) or len(scales) != ndim or len(units) != ndim:
        return None
    x, y = micrometres(scales[ndim - 1], units[ndim - 1]), micrometres(scales[ndim - 2], units[ndim - 2])
    return None if x is None or y is None else (x, y)


def plan_slide(levels: Sequence[ArrayView], paths: Sequence[str], attrs: dict[str, Any],
               label: str) -> SlideLayout | None:
    """The OpenSlide layout of a pyramid (`levels`: the arrays of dataset `paths`, as
    `pyramid_levels` kept them), or None when OpenSlide cannot show it (logged)."""
    first = levels[0].source
    if np.dtype(first.dtype) != np.uint8:
        log.debug("%s: no %s: OpenSlide shows 8-bit images, this is %s", label, SLIDE_NAME, first.dtype)
        return None
    datasets = ome_datasets(attrs) or {}
    ndim = len(first.shape)
    axes = ImageAxes.of(levels[0])  # (in image order, as the levels are planned)
    lead, _, _ = axes.dims(first.shape)
    planes = math.prod(lead)
    samples = 1
    if planes == 3:
        axis = _channel_axis(axes.ome(datasets.get(paths[0].strip("/")) or datasets.get("")), ndim)
        if axis is None or lead[axis] != 3:
            log.debug("%s: no %s: 3 planes, but not 3 channels", label, SLIDE_NAME)
            return None
        samples = 3
    elif planes != 1:
        log.debug("%s: no %s: %d planes (OpenSlide shows one grayscale or RGB plane)", label, SLIDE_NAME, planes)
        return None
    resolutions: list[tuple[int, int, int, int] | None] = []
    for path in paths[: len(levels)]:
        mpp = microns_per_pixel(axes.ome(datasets.get(path.strip("/"))), ndim)
        # pixels per centimetre: 10,000 microns / microns per pixel
        resolutions.append(None if mpp is None else (*_rational(1e4 / mpp[0]), *_rational(1e4 / mpp[1])))
    return SlideLayout(samples, tuple(resolutions))
