"""The OME side of a whole-image file: its OME-XML (pixel type, Z/C/T of the leading
axes, physical sizes, channel names and colours) and the readers of the OME-Zarr
group attributes it comes from (multiscales' name and dataset paths, omero channels).

Text only: no tiles, no store, no FUSE.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

import numpy as np

from zfuse.view.ome_zarr import axis_role, channels_of, image_name, multiscale_list, ome_attributes
from zfuse.view.units import unit_of
from zfuse.view.whole_image.layout import image_dims

_OME_TYPES = {
    "b1": "uint8", "u1": "uint8", "i1": "int8", "u2": "uint16", "i2": "int16",
    "u4": "uint32", "i4": "int32", "f4": "float", "f8": "double",
    "c8": "complex", "c16": "double-complex",
}  # fmt: skip


def _role(name: str | None, kind: str | None) -> str | None:
    """OME's Z, C or T for a leading axis, as the chunk files name its ImageJ role."""
    role = axis_role(name, kind)
    return role.upper() if role is not None else None


@dataclass(frozen=True)
class PlaneAxes:
    """How the leading axes map onto OME's Z, C and T."""

    order: str  # DimensionOrder, e.g. "XYZCT"
    sizes: dict[str, int]  # Z, C, T
    axis_of: dict[str, int | None]  # role -> leading axis index when one axis carries it


def plane_axes(
    lead: Sequence[int], axes: Sequence[str | None] | None, types: Sequence[str | None] | None
) -> PlaneAxes:
    """OME Z/C/T for leading axes of shape `lead`, planes in C order.

    Axes of size 1 do not change the plane order and take no role. Named axes
    (OME-Zarr type, or names z/c/t) keep their role; the others take the free
    roles fastest first in the order Z, C, T. More than three axes of size > 1:
    the slowest are merged into one role (their planes stay in C order).
    """
    names = list(axes or [None] * len(lead))[: len(lead)]
    kinds = list(types or [None] * len(lead))[: len(lead)]
    big = [i for i, n in enumerate(lead) if n > 1]
    groups: list[list[int]] = [[i] for i in big]
    while len(groups) > 3:
        groups[0:2] = [groups[0] + groups[1]]
    wanted = [_role(names[g[0]], kinds[g[0]]) if len(g) == 1 else None for g in groups]
    roles: list[str | None] = [None] * len(groups)
    used: set[str] = set()
    for k, r in enumerate(wanted):
        if r is not None and r not in used:
            roles[k] = r
            used.add(r)
    for k in range(len(groups) - 1, -1, -1):  # fastest first
        if roles[k] is None:
            roles[k] = next(r for r in "ZCT" if r not in used)
            used.add(roles[k])  # type: ignore[arg-type]
    sizes = {"Z": 1, "C": 1, "T": 1}
    axis_of: dict[str, int | None] = {"Z": None, "C": None, "T": None}
    for g, r in zip(groups, roles, strict=True):
        assert r is not None
        sizes[r] = math.prod(lead[i] for i in g)
        axis_of[r] = g[0] if len(g) == 1 else None
    # size-1 axes named z/c/t still say which axis calibrates a role
    for i, n in enumerate(lead):
        r = _role(names[i], kinds[i])
        if n == 1 and r is not None and axis_of[r] is None and sizes[r] == 1:
            axis_of[r] = i
    fast_first = [r for r in reversed(roles) if r is not None]
    order = "XY" + "".join(fast_first) + "".join(r for r in "ZCT" if r not in fast_first)
    return PlaneAxes(order=order, sizes=sizes, axis_of=axis_of)


def ome_pixel_type(dtype: np.dtype) -> str | None:
    dt = np.dtype(dtype)
    return _OME_TYPES.get(f"{dt.kind}{dt.itemsize}")


# what XML 1.0 cannot hold (control characters, lone surrogates, U+FFFE/U+FFFF): a name
# or label from a store's attributes or keys may (a crafted one, or a writer's slip)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_attr(value: object) -> str:
    """`value` as an XML attribute value, quoted; characters XML cannot hold become
    U+FFFD, so the document stays well-formed (readers parse it) and encodes as UTF-8."""
    return quoteattr(_NOT_XML.sub("\ufffd", str(value)))


#: channels an OME-XML lists one by one (names, colours) at most
CHANNELS_LISTED = 4096


def ome_xml(
    name: str,
    shape: Sequence[int],
    dtype: np.dtype,
    ome: dict[str, Any] | None,
    channels: list[dict[str, Any]] | None,
) -> str | None:
    """OME-XML for an image of `shape` (the whole array, level 0); None when the dtype
    has no OME pixel type."""
    pixel_type = ome_pixel_type(dtype)
    if pixel_type is None:
        return None
    ome = ome or {}
    lead, height, width = image_dims(shape)
    nd = len(shape)
    axes, types = ome.get("axes"), ome.get("axis_types")
    planes = plane_axes(lead, axes, types)
    scales, units = ome.get("scales"), ome.get("units")
    attrs = [
        ("ID", "Pixels:0"), ("DimensionOrder", planes.order), ("Type", pixel_type),
        ("SizeX", width), ("SizeY", height), ("SizeZ", planes.sizes["Z"]),
        ("SizeC", planes.sizes["C"]), ("SizeT", planes.sizes["T"]),
        ("BigEndian", "false"), ("Interleaved", "false"),
        ("SignificantBits", 8 * np.dtype(dtype).itemsize if pixel_type != "bit" else 1),
    ]  # fmt: skip

    def physical(axis: int | None, key: str, unit_key: str, time_axis: bool = False) -> None:
        if axis is None or scales is None or axis < 0 or axis >= len(scales):
            return
        value = float(scales[axis])
        if not math.isfinite(value) or value <= 0:
            return
        named = units[axis] if units and axis < len(units) else None
        if not named:  # (no unit said: OME's default, micrometres or seconds, as before)
            attrs.append((key, repr(value)))
            return
        unit = unit_of(named)
        if unit is None or unit.kind != ("time" if time_axis else "length"):
            return  # a size without its unit would be read as micrometres or seconds
        attrs.append((key, repr(value)))
        attrs.append((unit_key, unit.ome))

    if nd >= 1:
        physical(nd - 1, "PhysicalSizeX", "PhysicalSizeXUnit")
    if nd >= 2:
        physical(nd - 2, "PhysicalSizeY", "PhysicalSizeYUnit")
    physical(planes.axis_of["Z"], "PhysicalSizeZ", "PhysicalSizeZUnit")
    physical(planes.axis_of["T"], "TimeIncrement", "TimeIncrementUnit", time_axis=True)

    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:schemaLocation="http://www.openmicroscopy.org/Schemas/OME/2016-06 '
        'http://www.openmicroscopy.org/Schemas/OME/2016-06/ome.xsd" Creator="zfuse">',
        f"<Image ID=\"Image:0\" Name={_xml_attr(name)}>",
        "<Pixels " + " ".join(f"{k}={_xml_attr(v)}" for k, v in attrs) + ">",
    ]
    size_c = planes.sizes["C"]
    named = channels if channels and len(channels) == size_c else None
    # a <Channel> each, up to CHANNELS_LISTED: SizeC says how many there are, and readers
    # fill in the rest (an unnamed axis of 10**9 channels wanted 50 GB of XML at `ls`)
    for c in range(size_c if size_c <= CHANNELS_LISTED else 0):
        extra = ""
        if named is not None and isinstance(named[c], dict):
            label = named[c].get("label")
            if label:
                extra += f" Name={_xml_attr(label)}"
            color = _ome_color(named[c].get("color"))
            if color is not None:
                extra += f' Color="{color}"'
        lines.append(f'<Channel ID="Channel:0:{c}" SamplesPerPixel="1"{extra}/>')
    total = planes.sizes["Z"] * size_c * planes.sizes["T"]
    lines.append(f'<TiffData IFD="0" PlaneCount="{total}"/>')
    lines += ["</Pixels>", "</Image>", "</OME>"]
    return "\n".join(lines) + "\n"


def _ome_color(value: Any) -> int | None:
    """omero's "RRGGBB" as OME's signed 32-bit RGBA."""
    if not isinstance(value, str) or len(value) != 6:
        return None
    try:
        rgba = int(value + "FF", 16)
    except ValueError:
        return None
    return rgba - 2**32 if rgba >= 2**31 else rgba


def multiscale_name(attrs: dict[str, Any]) -> str | None:
    """The name of the first OME-Zarr multiscale in group attributes (`image_name`), if any."""
    ms = multiscale_list(attrs)
    if not ms or not isinstance(ms[0], dict):
        return None
    return image_name(ms[0], ome_attributes(attrs).get("omero"))


def multiscale_count(attrs: dict[str, Any]) -> int:
    """How many OME-Zarr multiscales group attributes list."""
    return len(multiscale_list(attrs))


def multiscale_paths(attrs: dict[str, Any]) -> list[str] | None:
    """Dataset paths of the first OME-Zarr multiscale in group attributes, if any."""
    ms = multiscale_list(attrs)
    if not ms or not isinstance(ms[0], dict):
        return None
    datasets = ms[0].get("datasets")
    paths = [d.get("path") for d in datasets if isinstance(d, dict)] if isinstance(datasets, list) else []
    return [str(p) for p in paths if p] or None


def omero_channels(attrs: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The channels of group attributes' `omero` (`channels_of`)."""
    return channels_of(ome_attributes(attrs).get("omero"))
