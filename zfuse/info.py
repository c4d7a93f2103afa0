"""`zfuse info`: what the view of a source will contain, without mounting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zfuse.errors import ZfuseError, printable
from zfuse.open_view import make_view

if TYPE_CHECKING:
    from zfuse.daemon import MountConfig


def describe_source(config: MountConfig) -> dict[str, Any]:
    view = make_view(config, all_members=True)
    view.open_all()  # (a remote store's groups open lazily on a mount; info shows them all)
    reasons = {problem.path: problem.reason for problem in view.problems}
    arrays = []
    for path, arr in view.arrays():
        src = arr.source
        item: dict[str, Any] = {
            "path": "/".join(path) or "/",
            "shape": list(src.shape),
            "dtype": str(src.dtype),
            "chunk_shape": list(src.chunk_shape),
            "grid_shape": list(src.grid_shape),
            "extensions": src.extensions(),
        }
        if arr.axes is not None:
            item["axes"] = _axes_said(arr.axes, arr.ome)
        shard_shape = getattr(src, "shard_shape", None)
        if getattr(src, "sharding", None) is not None:
            item["shard_shape"] = list(shard_shape)
        if arr.layout is None:
            item["shown"] = False
            item["why_not"] = reasons.get(item["path"], arr.unsupported)
        else:
            item["shown"] = True
            item["tiff_header_bytes"] = arr.layout.header_size
            item["tiff_file_bytes"] = arr.layout.file_size
            item["bigtiff"] = arr.layout.bigtiff
            # what ImageJ and Bio-Formats are told: roles and calibration (not the origins)
            item["imagej"] = [line for line in arr.layout.description.splitlines()[1:]
                              if not line.split("=")[0].endswith("origin") and not line.startswith("loop=")]
            pixel = arr.layout.pixel_size()
            if pixel is not None:  # (in the resolution tags, not the description)
                item["imagej"].append(f"pixel={pixel[1]:.6g}x{pixel[0]:.6g}")
            try:
                item["files"] = arr.count_files()
            except (ZfuseError, OSError) as e:  # (one corrupt shard index: that array's count, not the report)
                item["files"], item["files_error"] = None, f"{type(e).__name__}: {e}"
        concat = getattr(src, "array", None)
        if concat is not None and hasattr(concat, "straddling_chunks"):
            from zfuse.ext.concat import describe

            item["concat"] = describe(concat)
        arrays.append(item)
    # nodes zarr-python could not open: their path and reason only
    listed = {a["path"] for a in arrays}
    for problem in view.problems:
        if problem.path not in listed:
            arrays.append({"path": problem.path, "shown": False, "why_not": problem.reason})
    arrays.sort(key=lambda a: a["path"])
    images = []
    for path, image in view.all_whole_images():
        image.settle()  # passthrough vs decoded (looks up stored sizes); builds no header
        images.append({"path": "/".join(path), **image.describe()})
    return {
        "sources": config.sources,
        "arrays": arrays,
        "not_shown": [{"path": p.path, "reason": p.reason} for p in view.problems],
        "whole_image_files": images,
        "whole_image_files_not_shown": [{"path": p, "reason": r} for p, r in sorted(view.images_not_shown.items())],
    }


def _axes_said(axes: list[str], ome: dict[str, Any] | None) -> list[str]:
    """Each axis as the store says it: its name, and its OME-Zarr scale and unit (what a
    store names, printable and cut short: a crafted name is no terminal escape)."""
    ome = ome or {}
    scales, units = ome.get("scales") or [], ome.get("units") or []

    def shown(value: object) -> str:
        return printable(str(value))[:40]

    out = []
    for i, name in enumerate(axes):
        said = shown(name)
        if i < len(scales) and scales[i] is not None:
            said += f" {scales[i]:g}" + (f" {shown(units[i])}" if i < len(units) and units[i] else "")
        out.append(said)
    return out


def format_report(report: dict[str, Any]) -> str:
    lines = [f"source: {' '.join(report['sources'])}"]
    for a in report["arrays"]:
        lines.append(f"array {a['path']}")
        if "shape" not in a:  # zarr-python could not open it
            lines.append(f"  not shown: {a['why_not']}")
            continue
        lines.append(f"  shape {tuple(a['shape'])}  dtype {a['dtype']}")
        grid = f"  chunks {tuple(a['chunk_shape'])}  grid {tuple(a['grid_shape'])}"
        if "shard_shape" in a:
            grid += f"  (inner chunks of shards {tuple(a['shard_shape'])})"
        lines.append(grid)
        ext = list(a["extensions"])
        lines.append(f"  codecs/extensions: {', '.join(map(str, ext)) or '-'}")
        if a.get("axes"):
            lines.append(f"  axes: {', '.join(a['axes'])}")
        if a["shown"]:
            lines.append(
                f"  TIFF: header {a['tiff_header_bytes']} B, file {a['tiff_file_bytes']} B"
                f"{' (BigTIFF)' if a['bigtiff'] else ''}, "
                + (f"{a['files']} chunk files" if a["files"] is not None
                   else f"chunk files not counted: {a['files_error']}")
            )
            if a.get("imagej"):
                lines.append(f"  chunk files say (ImageJ): {' '.join(a['imagej'])}")
        else:
            lines.append(f"  not shown as TIFF: {a['why_not']}")
        if "concat" in a:
            c = a["concat"]
            lines.append(f"  concatenation along axis {c.get('axis')}:")
            for s in c.get("sources", []):
                lines.append(f"    {s.get('name')}: shape {tuple(s.get('shape', ()))} at offset {s.get('offset')}")
            strad = c.get("straddling_chunks", [])
            total = c.get("straddling_total", len(strad))
            lines.append(f"  view chunks straddling a boundary: {total}"
                         + (f" e.g. {', '.join(str(tuple(x)) for x in strad[:5])}" if strad else ""))
    if report.get("not_shown"):
        lines.append(f"{len(report['not_shown'])} not shown (each directory holds a README saying why)")
    for f in report.get("whole_image_files", []):
        tiles = " / ".join(f"{h}x{w}" for h, w in f["tile_shape"])
        lines.append(f"whole image {f['path']}: {f['size']} B{' (BigTIFF)' if f['bigtiff'] else ''}, "
                     f"{f['levels']} level{'s' if f['levels'] > 1 else ''}, {f['planes']} planes, "
                     f"{f['tiles']} tiles of {tiles}, {', '.join(sorted(set(f['mode'])))}"
                     + (f"; {f['levels_note']}" if f.get("levels_note") else ""))
    for f in report.get("whole_image_files_not_shown", []):
        where = f"no {f['path']}" if f["path"].endswith(".tif") else f"no whole-image file in {f['path']}"
        lines.append(f"{where}: {f['reason']}")
    lines += [f"note: {note}" for note in report.get("notes", [])]
    return "\n".join(lines)
