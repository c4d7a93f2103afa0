"""The TIFF headers zfuse generates, byte for byte: chunk-file headers (`tiff.py`) and
whole-image headers (`view/whole_image/`), against digests recorded from the code
before their IFD encoders became one (`tiff_ifd.py`). A change to either header's
bytes fails here; record new digests (`ZFUSE_RECORD_IFD_BYTES=1`) only when the
change is meant."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
from zarr.codecs.numcodecs import Zlib as Zlib3

from zfuse.daemon import MountConfig
from zfuse.open_view import make_view
from zfuse.stats import Stats
from zfuse.view.tiff import build_header, plan_layout

GOLDEN = Path(__file__).parent / "data" / "ifd_bytes.json"
RECORD = os.environ.get("ZFUSE_RECORD_IFD_BYTES") == "1"

# (name, chunk shape, dtype, plan_layout keywords, [(coords, cropped shape or None)])
CHUNK_CASES = [
    ("u1-2d", (64, 48), "u1", {}, [((0, 0), None), ((3, 2), (10, 48))]),
    ("u2-3d", (5, 32, 32), "u2", {"grid_shape": (2, 10, 10)}, [((1, 9, 9), (5, 7, 3))]),
    ("f4-tczyx", (2, 3, 4, 16, 16), "f4",
     {"axes": ["t", "c", "z", "y", "x"], "axis_types": ["time", "channel", "space", "space", "space"],
      "scales": [2.0, 1.0, 0.5, 0.25, 0.25], "units": ["second", None, "micrometer", "micrometer", "micrometer"]},
     [((0, 0, 0, 0, 0), None), ((1, 2, 3, 4, 5), (1, 2, 3, 16, 9))]),
    ("bool-1d", (100,), "?", {}, [((7,), None)]),
    ("c16-scalar", (), "c16", {}, [((), None)]),
    ("i8-pages", (300, 8, 8), "i8", {}, [((2, 0, 0), None)]),
    ("u1-bigtiff", (2, 50000, 50000), "u1", {"grid_shape": (1, 1, 1)}, [((0, 0, 0), None)]),
]


def chunk_headers() -> dict[str, str]:
    out = {}
    for name, shape, dtype, kw, reads in CHUNK_CASES:
        layout = plan_layout(shape, dtype, **kw)
        for coords, crop in reads:
            header = build_header(layout, coords, shape=crop)
            out[f"chunk {name} {coords} {crop}"] = hashlib.sha256(header).hexdigest()
    return out


def make_stores(root: Path) -> Path:
    g = zarr.open_group(str(root / "s.zarr"), mode="w")
    a = g.create_array("u8", shape=(300, 260), chunks=(64, 64), dtype="uint8", fill_value=0,
                       compressors=[ZstdCodec(level=1)])
    a[...] = np.arange(300 * 260, dtype=np.uint64).reshape(300, 260).astype("uint8")
    a = g.create_array("u16", shape=(3, 2, 100, 90), chunks=(1, 1, 50, 45), dtype="uint16", fill_value=7)
    a[:, :, :60, :] = 3
    a = g.create_array("f32", shape=(2, 40, 70), chunks=(2, 16, 16), dtype="float32", fill_value=0)
    a[...] = 1.5
    # deflate passthrough (with a crc32c), partly stored
    a = g.create_array("zl", shape=(128, 192), chunks=(64, 64), dtype="uint16", fill_value=0,
                       serializer=BytesCodec(), compressors=[Zlib3(level=5), Crc32cCodec()])
    a[:64, :] = np.arange(64 * 192, dtype="uint16").reshape(64, 192)
    # raw passthrough from local files
    a = g.create_array("raw", shape=(128, 128), chunks=(64, 64), dtype="uint16", fill_value=0,
                       serializer=BytesCodec(), compressors=None)
    a[:64, :64] = 9
    # big: BigTIFF, nothing stored
    g.create_array("big", shape=(70000, 70000), chunks=(1024, 1024), dtype="uint8", fill_value=0)
    # an OME-Zarr pyramid (c, y, x) with channel names
    ms = g.create_group("ms")
    for lv in range(3):
        a = ms.create_array(str(lv), shape=(2, 256 >> lv, 200 >> lv), chunks=(1, 64, 64), dtype="uint16",
                            fill_value=0, compressors=[ZstdCodec(level=1)])
        a[...] = lv + 1
    ms.attrs["multiscales"] = [{
        "version": "0.4", "name": "pyr",
        "axes": [{"name": "c", "type": "channel"}, {"name": "y", "type": "space", "unit": "micrometer"},
                 {"name": "x", "type": "space", "unit": "micrometer"}],
        "datasets": [{"path": str(lv), "coordinateTransformations": [
            {"type": "scale", "scale": [1.0, 0.5 * 2**lv, 0.5 * 2**lv]}]} for lv in range(3)],
    }]
    ms.attrs["omero"] = {"channels": [{"label": "DAPI", "color": "0000FF"}, {"label": "GFP", "color": "00FF00"}]}
    return root / "s.zarr"


def image_headers(store: Path) -> dict[str, str]:
    view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
    out = {}
    for path, image in sorted(view.all_whole_images()):
        if path[-1] not in ("image.ome.tif", "pyramid.ome.tif"):
            continue  # (the digests pin the tiled files' encoder; image.tif and slide.tif came later)
        header = image.header()
        assert len(header) == image.header_size
        out[f"image {'/'.join(path)} size={image.size} bigtiff={image.bigtiff} {image.modes()}"] = hashlib.sha256(header).hexdigest()
    for _, arr in sorted(view.arrays(), key=lambda p: p[0]):
        if arr.layout is not None:
            out[f"layout {arr.source.name} {arr.layout.header_size}"] = hashlib.sha256(arr.layout._template).hexdigest()
    return out


def test_header_bytes_are_the_recorded_ones(tmp_path: Path) -> None:
    found = {**chunk_headers(), **image_headers(make_stores(tmp_path))}
    assert any(k.startswith("image ms/pyramid.ome.tif") for k in found)
    if RECORD:
        GOLDEN.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    assert found == json.loads(GOLDEN.read_text())
