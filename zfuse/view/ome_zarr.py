"""What OME-Zarr group attributes say of the arrays below them: axis names, types
(their roles: channel, z, time), units and scales per dataset, from every multiscale
of a group (OME-Zarr 0.1-0.6 spellings), and which image each dataset is a level of.

Shared by the chunk files' headers (`tiff_meta`), the whole-image files' OME-XML
(`whole_image/ome.py`) and OpenSlide's layout (`whole_image/slide.py`). JSON only:
no TIFF, no store, no FUSE. A store's attributes may be any JSON (crafted): every
reader here takes what has the right type and leaves the rest.
"""

from __future__ import annotations

from typing import Any

# dimension names of channels beyond OME-Zarr's "c": xarray/rioxarray's "band", colours
_CHANNEL_NAMES = ("c", "ch", "channel", "channels", "band", "bands", "rgb", "rgba", "color", "colour")


_ROLE_OF_KIND = {"channel": "c", "time": "t", "space": "z"}
_ROLE_OF_NAME = {**dict.fromkeys(_CHANNEL_NAMES, "c"), "t": "t", "time": "t", "z": "z"}


def axis_role(name: object, kind: object) -> str | None:
    """The role ("c", "z" or "t") of an axis that is not a row or column axis: its OME-Zarr
    type, else its name (one table for the chunk files' ImageJ roles and OME-XML's Z/C/T)."""
    if isinstance(kind, str) and kind.lower() in _ROLE_OF_KIND:
        return _ROLE_OF_KIND[kind.lower()]
    if isinstance(name, str) and name:
        return _ROLE_OF_NAME.get(name.lower())
    return None


def ome_axes(group_attrs: dict[str, Any], array_name: str) -> dict[str, Any] | None:
    """Axis names/types/units and scales for `array_name` (a dataset path relative to
    the group, or a member's name) from OME-Zarr multiscales in the group's attributes."""
    datasets = ome_datasets(group_attrs)
    if datasets is None:
        return None
    return datasets.get(array_name) or {**datasets[""], "scales": None}


#: datasets of a multiscale taken (the first ones): far past any pyramid (2x per level),
#: and a crafted list of a million is not a million lookups and copies
MULTISCALE_LEVELS_MAX = 64


#: multiscales of one group read (OME-Zarr lists one image's, bioformats2raw-like
#: groups several): a crafted list of a million is not a million passes
MULTISCALES_MAX = 64

#: OME-Zarr 0.1 and 0.2 name no axes: every array is (t, c, z, y, x)
_IMPLICIT_AXES = (["t", "c", "z", "y", "x"], ["time", "channel", "space", "space", "space"])


def ome_datasets(group_attrs: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """{dataset path: axis names/types/units and scales} of the OME-Zarr multiscales in
    a group's attributes (OME-Zarr 0.4 attributes, or 0.5's under "ome"), with the key
    "" for the first multiscale's axes alone; None if the group has none. A dataset two
    multiscales list takes the first's.

    Dataset paths may be nested (ngff-zarr writes `scale0/image`): callers match them
    against an array's path relative to the group. A scale is the dataset's scale
    times the multiscale's own (OME-Zarr 0.4's multiscale-level transformations).
    Each entry's "image" says which image it is a level of, for files of an array
    below the group: the multiscale's name, the dataset's path, its level (its place in
    the multiscale's list) and the group's `omero` (channel names and colours)."""
    multiscales = multiscale_list(group_attrs)
    if not multiscales or not isinstance(multiscales[0], dict):
        return None
    out: dict[str, dict[str, Any]] = {}
    for ms in multiscales[:MULTISCALES_MAX]:
        if isinstance(ms, dict):
            for path, ome in _multiscale_datasets(ms, ome_attributes(group_attrs).get("omero")).items():
                out.setdefault(path, ome)
    return out


def ome_attributes(group_attrs: Any) -> dict[str, Any]:
    """A group's OME-Zarr attributes: 0.5's under "ome", else 0.4's at the top; {} for
    attributes that are no object."""
    attrs = group_attrs.get("ome", group_attrs) if isinstance(group_attrs, dict) else {}
    return attrs if isinstance(attrs, dict) else {}


def multiscale_list(group_attrs: Any) -> list[Any]:
    """The multiscales a group's OME-Zarr attributes list, as stored (any JSON in it);
    [] where there is no list."""
    multiscales = ome_attributes(group_attrs).get("multiscales")
    return multiscales if isinstance(multiscales, list) else []


def channels_of(omero: Any) -> list[dict[str, Any]] | None:
    """The channels (names, colours, windows) of an `omero` attribute, if it lists them."""
    channels = omero.get("channels") if isinstance(omero, dict) else None
    return channels if isinstance(channels, list) else None


def _multiscale_axes(ms: dict[str, Any]) -> list[Any]:
    """A multiscale's axes: its own (OME-Zarr 0.3-0.5), else those of the coordinate system
    its datasets' scales lead to (0.6's `coordinateSystems`: the one their transformations'
    `output` names, else the first)."""
    axes = ms.get("axes")
    if isinstance(axes, list):
        return axes
    systems = ms.get("coordinateSystems")
    systems = [s for s in systems if isinstance(s, dict)] if isinstance(systems, list) else []
    if not systems:
        return []  # (crafted: any JSON)
    outputs: set[str] = set()
    for ds in ms.get("datasets") if isinstance(ms.get("datasets"), list) else []:
        transforms = ds.get("coordinateTransformations") if isinstance(ds, dict) else None
        for t in transforms if isinstance(transforms, list) else []:
            output = t.get("output") if isinstance(t, dict) else None
            if isinstance(output, dict):  # (the 0.6 schema's spelling: {"name": ...})
                output = output.get("name")
            if isinstance(output, str):
                outputs.add(output)
    chosen = next((s for s in systems if isinstance(s.get("name"), str) and s["name"] in outputs), systems[0])
    axes = chosen.get("axes")
    return axes if isinstance(axes, list) else []


def _multiscale_datasets(ms: dict[str, Any], omero: Any) -> dict[str, dict[str, Any]]:
    axes = _multiscale_axes(ms)
    names = [a.get("name") if isinstance(a, dict) else str(a) for a in axes]
    types = [a.get("type") if isinstance(a, dict) else None for a in axes]
    units = [a.get("unit") if isinstance(a, dict) else None for a in axes]
    implied = not axes and ms.get("version") in ("0.1", "0.2")
    if implied:
        names, types = (list(v) for v in _IMPLICIT_AXES)
    # (0.4's multiscale-level scale applies to every dataset; 0.6's maps between named
    # coordinate systems, not into the datasets' own)
    common = None if isinstance(ms.get("coordinateSystems"), list) else _scale_of(ms.get("coordinateTransformations"))
    base = {"axes": names or None, "axis_types": types or None, "units": units or None, "scales": None,
            "implied": implied}
    out = {"": base}
    name = image_name(ms, omero)
    datasets = ms.get("datasets")
    for level, ds in enumerate(datasets[:MULTISCALE_LEVELS_MAX] if isinstance(datasets, list) else []):
        if not isinstance(ds, dict) or not isinstance(ds.get("path"), str):
            continue
        scales = _scale_of(ds.get("coordinateTransformations"))
        if scales is not None and common is not None and len(common) == len(scales):
            scales = [a * b for a, b in zip(scales, common, strict=True)]
        path = ds["path"].strip("/")
        out.setdefault(path, {**base, "scales": scales,
                              "image": {"name": name, "path": path, "level": level, "omero": omero}})
    return out


def image_name(multiscale: dict[str, Any], omero: Any) -> str | None:
    """An OME-Zarr image's name: its multiscale's `name`, else `omero`'s (aicsimageio names
    its multiscale "/"); None if neither names it."""
    for name in (multiscale.get("name"), omero.get("name") if isinstance(omero, dict) else None):
        if isinstance(name, str) and name.strip(" /"):
            return name.strip(" /")
    return None


def fitted_ome(ome: dict[str, Any] | None, ndim: int) -> dict[str, Any] | None:
    """`ome` for an array of `ndim` axes: axes OME-Zarr 0.1/0.2 imply (t, c, z, y, x) are
    left out of an array that is not 5-d (a writer's slip: shown plain, as before,
    where axes a store names wrongly are refused with the reason)."""
    if ome is not None and ome.get("implied") and len(ome.get("axes") or ()) != ndim:
        return {**ome, "axes": None, "axis_types": None, "implied": False}
    return ome


def _scale_of(transformations: Any) -> list[float] | None:
    """The scale of a list of coordinate transformations: a `scale` one's, or one inside
    a `sequence` (OME-Zarr 0.6: a scale then a translation)."""
    for t in transformations if isinstance(transformations, list) else []:
        if isinstance(t, dict) and t.get("type") == "sequence":
            inner = _scale_of(t.get("transformations"))
            if inner is not None:
                return inner
        if isinstance(t, dict) and t.get("type") == "scale" and isinstance(t.get("scale"), list):
            try:
                return [float(v) for v in t["scale"]]
            except (TypeError, ValueError, OverflowError):  # (OverflowError: a 400-digit integer)
                return None
    return None
