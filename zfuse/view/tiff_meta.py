"""What a chunk file's header says: ImageJ metadata from OME-Zarr axes, and the
chunk position record. Pure functions, no I/O, no TIFF structure (`tiff.py`
assembles the IFDs; `tiff_parse.py` reads the position back).

Invariants (the rest of zfuse relies on them):

- Page order is ImageJ's whenever the leading axes can be named as channel,
  z and time (OME-Zarr axis names/types): c fastest, then z, then t. A chunk
  whose axes are stored in another order (OME-Zarr's t, c, z) is transposed:
  ``file_axes`` is that permutation (identity otherwise), the file is a true
  ImageJ hyperstack, and the view's zarr.json declares the permutation with
  the standard ``transpose`` codec so that zarr reads the files exactly.
  Axes that cannot all be named (or two with one role) make a plain stack in
  chunk order.
- The chunk position is JSON, ``{"chunk":[..],"origin":[..],"shape":[..]}``,
  written in DocumentName and in PageName (`POSITION_TAG`) of the first IFD,
  space-padded to a fixed width (``HeaderMeta.pos_width``) reserved from the
  grid size: the text of any chunk of the array fits, so the header size never
  depends on the coordinates.
- The ImageJ description's origin fields (``xorigin=`` ...) come right after
  its first line, at a fixed width: they sit at the same offsets in full and
  cropped headers, and are patched per chunk like the position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from zfuse.view import units
from zfuse.view.ome_zarr import axis_role

#: ASCII tag holding the chunk position as JSON (first IFD), besides DocumentName.
#: PageName (285), a standard tag: a private tag (65000+) makes libtiff, and so
#: tiffinfo/ImageMagick, print "Unknown field with tag" for every file opened.
POSITION_TAG = 285
DOCUMENT_NAME = 269
IMAGE_DESCRIPTION = 270
# (their field type, ASCII, is `tiff_ifd.ASCII`)

_UINT32_MAX = 2**32 - 1  # a TIFF RATIONAL is two uint32
_FREE_DIGITS = 20  # width per coordinate when the grid size is unknown (uint64)

_SAFE_UNIT = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")


@dataclass(frozen=True)
class HeaderMeta:
    """Everything the header says besides shape, dtype and bigtiff: ImageJ roles and
    calibration, and the widths of the position fields."""

    ndim: int
    # ImageJ role ("c"/"z"/"t"; None for size 1 and the image's rows and columns) per
    # chunk axis; None = plain stack
    roles: tuple[str | None, ...] | None
    # chunk axes in the file's order: the page axes as the pages run, then rows, columns
    file_axes: tuple[int, ...]
    image_axes: tuple[int, ...]  # the chunk axes that are rows and columns (`image_axes`)
    xres: tuple[int, int, int, int] | None  # XResolution num/den, YResolution num/den
    unit: str | None  # of the columns (x): ImageJ's for the rows and z too, unless these say their own
    zspacing: float | None
    tinterval: float | None
    tunit: str | None
    yunit: str | None  # the rows' unit where it is not `unit`
    zunit: str | None  # z's unit where it is not `unit`
    coord_digits: tuple[int, ...]
    origin_digits: tuple[int, ...]
    pos_width: int  # bytes reserved for the position JSON (without NUL)


def _digits(n: int) -> int:
    return len(str(max(int(n), 0)))


_IJ_RANK = {"t": 0, "z": 1, "c": 2}  # ImageJ's page order: t slowest, c fastest


def image_axes(ndim: int, axes: Sequence[str | None] | None) -> tuple[int, ...]:
    """The chunk axes that are a file's rows and columns: the axes named y and x
    (OME-Zarr axes, or dimension names: ``("y", "x", "c")`` is an image of 3
    channels), else the last two. A 1-d chunk is one row (its axis the columns), a
    0-d chunk one pixel."""
    if ndim < 2:
        return tuple(range(ndim))
    names = [n.lower() if isinstance(n, str) else None for n in axes] if axes is not None else []
    if len(names) == ndim and names.count("y") == 1 and names.count("x") == 1:
        return names.index("y"), names.index("x")
    return ndim - 2, ndim - 1


#: napari's guess of an RGB(A) image stored (y, x, c): 3 or 4 elements last, after two
#: axes of more than this many
_RGB_SIDE_MIN = 30


def array_axis_names(shape: Sequence[int], dimension_names: Sequence[Any] | None) -> list[str] | None:
    """Axis names of an array that has no OME-Zarr axes: its dimension names (v3, or
    xarray's v2 ``_ARRAY_DIMENSIONS``), else, for an unnamed array whose last axis
    has 3 or 4 elements after two longer ones, ``y, x, c`` (an RGB(A) image stored
    as PIL/imageio give it; napari guesses so too); else None."""
    ndim = len(shape)
    if dimension_names is not None and len(dimension_names) == ndim and all(
            isinstance(n, str) for n in dimension_names):
        return list(dimension_names)
    if ndim >= 3 and shape[-1] in (3, 4) and min(shape[-3:-1]) > _RGB_SIDE_MIN:
        return [""] * (ndim - 3) + ["y", "x", "c"]
    return None


def _roles(
    shape: tuple[int, ...], axes: Sequence[str] | None, axis_types: Sequence[str | None] | None,
    image: tuple[int, ...],
) -> tuple[tuple[str | None, ...] | None, tuple[int, ...]]:
    """ImageJ role ("c"/"z"/"t") of each axis (None for the image's rows and
    columns), and the page axes (every other axis) in the order the pages run:
    ImageJ's t, z, c (c fastest).

    Roles are None (a plain stack, pages in chunk order) if the page axes with more
    than one element cannot all be named, or two share a role. Axes of size 1
    do not affect the page order: they get no role, are not checked and stay
    where they are (OME-Zarr t,c,z chunks of (1, 1, 16) are a z stack)."""
    ndim = len(shape)
    lead = [i for i in range(ndim) if i not in image]
    if not lead:
        return (None,) * ndim, ()
    names = list(axes) if axes is not None else [None] * ndim
    kinds = list(axis_types) if axis_types is not None else [None] * ndim
    named = {i: axis_role(names[i], kinds[i]) for i in lead}
    big = [i for i in lead if shape[i] > 1]
    if len(big) <= 1:
        # one axis carries the pages: unnamed means slices, as ImageJ assumes
        only = big[0] if big else lead[-1]
        return tuple((named[i] or "z") if i == only else None for i in range(ndim)), tuple(lead)
    picked = [named[i] for i in big]
    if any(r is None for r in picked) or len(set(picked)) != len(picked):
        return None, tuple(lead)
    # the big axes, sorted into ImageJ's order, take the places of the big axes
    in_ij_order = iter(sorted(big, key=lambda i: _IJ_RANK[named[i]]))  # type: ignore[index]
    pages = tuple(next(in_ij_order) if shape[i] > 1 else i for i in lead)
    return tuple(named[i] if i in big else None for i in range(ndim)), pages


# what a TIFF resolution (the inverse of a pixel's size: a rational of uint32s) can hold
_RESOLUTION_RANGE = (1.0 / _UINT32_MAX, float(_UINT32_MAX))


def _ij_calibration(scale: float | None, unit: object, kind: str,
                    resolution: bool = False) -> tuple[float | None, str | None]:
    """A scale and its unit as an ImageJ description states them: in micrometres
    ("micron") or seconds ("sec") when the unit is known (`units`: Bio-Formats reads an
    ImageJ TIFF's calibration so, whatever unit it names), a pixel size (`resolution`)
    only where a TIFF resolution holds it; else as the store names it (ImageJ shows
    that; other readers assume micrometres), or with no unit where the store says none.
    A unit of the other kind (a time on a length axis) states nothing."""
    if scale is None:
        return None, None
    known = units.unit_of(unit)
    if known is not None and known.kind != kind:
        return None, None
    converted = units.in_unit_size(scale, unit, kind)
    if converted is not None:
        if kind == "time":
            return converted, "sec"
        if not resolution or _RESOLUTION_RANGE[0] <= converted <= _RESOLUTION_RANGE[1]:
            return converted, "micron"
    named = unit if isinstance(unit, str) and _SAFE_UNIT.match(unit) else None
    return scale, named


def _rational(value: float) -> tuple[int, int]:
    """Closest fraction with numerator and denominator in uint32."""
    top = _UINT32_MAX
    if value >= top:
        return top, 1
    max_den = top if value < 1 else max(1, int(top / value))
    frac = Fraction(value).limit_denominator(max_den)
    num, den = min(frac.numerator, top), frac.denominator
    if num == 0:
        return 1, top
    return num, den


def _good_scale(s: float | None) -> float | None:
    if s is None:
        return None
    s = float(s)
    return s if math.isfinite(s) and s > 0 else None


def plan_meta(
    shape: tuple[int, ...],
    *,
    axes: Sequence[str] | None,
    axis_types: Sequence[str | None] | None,
    scales: Sequence[float] | None,
    units: Sequence[str | None] | None,
    grid_shape: Sequence[int] | None,
    array_shape: Sequence[int] | None,
) -> tuple[HeaderMeta, tuple[int, ...]]:
    """The header metadata of an array's chunks of `shape`, and the file's axis order
    (`file_axes`). Arguments as `tiff.plan_layout` takes them, their lengths checked."""
    ndim = len(shape)
    # Widths of the coordinate fields: the largest chunk index and origin.
    if grid_shape is None and array_shape is not None:
        grid_shape = [max(1, -(-int(a) // c)) for a, c in zip(array_shape, shape, strict=True)]
    if grid_shape is not None:
        coord_digits = tuple(_digits(int(g) - 1) for g in grid_shape)
        origin_digits = tuple(
            _digits((int(g) - 1) * c) for g, c in zip(grid_shape, shape, strict=True)
        )
    else:
        coord_digits = origin_digits = (_FREE_DIGITS,) * ndim
    widest = position_text(
        [10**d - 1 for d in coord_digits], [10**d - 1 for d in origin_digits], shape
    )

    image = image_axes(ndim, axes)
    roles, pages = _roles(shape, axes, axis_types, image)
    file_axes = (*pages, *image)
    sc = [_good_scale(s) for s in scales] if scales is not None else [None] * ndim
    un = list(units) if units is not None else [None] * ndim
    xres = unit = yunit = zspacing = zunit = tinterval = tunit = None
    if scales is not None and ndim >= 1:
        xs, unit = _ij_calibration(sc[image[-1]], un[image[-1]], "length", resolution=True)
        ys, yunit = _ij_calibration(sc[image[0]], un[image[0]], "length", resolution=True)
        xres = (*_rational(1.0 / (xs or 1.0)), *_rational(1.0 / (ys or 1.0)))
        if roles is not None:
            names = list(axes) if axes is not None else [None] * ndim
            kinds = list(axis_types) if axis_types is not None else [None] * ndim
            for i, r in enumerate(roles):
                if i in image:
                    continue
                # a size-1 axis has no ImageJ role but its scale still calibrates
                r = r or axis_role(names[i], kinds[i])
                if r == "z" and sc[i] is not None:
                    zspacing, zunit = _ij_calibration(sc[i], un[i], "length")
                elif r == "t" and sc[i] is not None:
                    tinterval, tunit = _ij_calibration(sc[i], un[i], "time")
    meta = HeaderMeta(
        ndim=ndim,
        roles=roles,
        file_axes=file_axes,
        image_axes=image,
        xres=xres,  # type: ignore[arg-type]
        unit=unit,
        zspacing=zspacing,
        tinterval=tinterval,
        tunit=tunit,
        yunit=yunit if yunit != unit else None,
        zunit=zunit if zunit != unit else None,
        coord_digits=coord_digits,
        origin_digits=origin_digits,
        pos_width=len(widest),
    )
    return meta, file_axes


def position_text(coords: Sequence[int], origin: Sequence[int], shape: Sequence[int]) -> bytes:
    c = ",".join(map(str, coords))
    o = ",".join(map(str, origin))
    s = ",".join(map(str, shape))
    return f'{{"chunk":[{c}],"origin":[{o}],"shape":[{s}]}}'.encode("ascii")


def imagej_description(meta: HeaderMeta, shape: Sequence[int]) -> tuple[str, list[tuple[int, int, int]]]:
    """ImageJ description for an image of `shape`, with zeroed origin fields.

    Returns the text and (offset in text, width, axis) of each origin value.
    The origin fields come right after the first line so that they sit at the
    same offset in full and cropped headers.
    """
    lines = ["ImageJ=1.11a"]
    origin_axes: list[tuple[str, int]] = []
    if meta.image_axes:
        origin_axes.append(("xorigin", meta.image_axes[-1]))
    if len(meta.image_axes) == 2:
        origin_axes.append(("yorigin", meta.image_axes[0]))
    if meta.roles and "z" in meta.roles:
        origin_axes.append(("zorigin", meta.roles.index("z")))
    fields: list[tuple[int, int, int]] = []
    pos = len(lines[0]) + 1
    for key, axis in origin_axes:
        width = meta.origin_digits[axis] + 1  # room for the minus sign
        lines.append(f"{key}={0:0{width}d}")
        fields.append((pos + len(key) + 1, width, axis))
        pos += len(lines[-1]) + 1

    pages = math.prod(n for i, n in enumerate(shape) if i not in meta.image_axes)
    if pages > 1:
        lines.append(f"images={pages}")
        if meta.roles is None:
            # Leading axes not nameable in ImageJ's order: a plain stack.
            lines.append(f"slices={pages}")
        else:
            size = {"c": 1, "z": 1, "t": 1}
            for r, n in zip(meta.roles, shape, strict=False):
                if r is not None:
                    size[r] = n
            for key, r in (("channels", "c"), ("slices", "z"), ("frames", "t")):
                if size[r] > 1:
                    lines.append(f"{key}={size[r]}")
            if size["c"] > 1 or size["t"] > 1:
                # Not only slices: ImageJ should show c/t sliders, not one z stack.
                lines.append("hyperstack=true")
            if size["c"] > 1:
                lines.append("mode=grayscale")
    if meta.unit:
        lines.append(f"unit={meta.unit}")
    if meta.yunit:
        lines.append(f"yunit={meta.yunit}")
    if meta.zspacing is not None:
        lines.append(f"spacing={meta.zspacing!r}")
        if meta.zunit:
            lines.append(f"zunit={meta.zunit}")
    if meta.tinterval is not None:
        lines.append(f"finterval={meta.tinterval!r}")
        if meta.tunit:
            lines.append(f"tunit={meta.tunit}")
    if pages > 1:
        lines.append("loop=false")
    return "\n".join(lines) + "\n", fields
