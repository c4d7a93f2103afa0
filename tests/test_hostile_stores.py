"""Hostile store metadata (issue 27): gigantic shapes, whole images of millions of
tiles, metadata nested thousands deep or too large. One bad array never costs the
daemon, its neighbours or `zfuse info` of the store; memory never follows the
number of tiles.

The stores are written by hand (a few KB of JSON, no data): zarr-python would
refuse to create most of them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

import zfuse.view.whole_image.image as whole_image
from zfuse.daemon import MountConfig
from zfuse.ext.metadata_json import (
    MAX_METADATA_BYTES,
    MAX_METADATA_DEPTH,
    metadata_problem,
    nesting_depth,
)
from zfuse.info import describe_source
from zfuse.open_view import make_view
from zfuse.stats import Stats

GIB = 1024**3


def _array(root: Path, name: str, shape: list[int], chunks: list[int], dtype: str = "uint16") -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    meta = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "attributes": {}}
    (root / name / "zarr.json").write_text(json.dumps(meta))


def _group(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    _array(root, "good", [64, 64], [32, 32])
    (root / "good" / "c" / "1").mkdir(parents=True)
    (root / "good" / "c" / "1" / "0").write_bytes(np.full((32, 32), 7, "<u2").tobytes())
    return root


def huge_store(root: Path) -> Path:
    """Shapes past what a whole-image file (or a chunk file) can express, beside a good array."""
    _group(root)
    _array(root, "big40", [2**40, 2**40], [256, 256])
    _array(root, "big62", [2**62, 2**62], [256, 256])
    _array(root, "big63", [2**63 - 1, 2], [256, 256])
    _array(root, "planes62", [2**62, 16, 16], [1, 16, 16])  # fine chunks, 2**62 planes
    _array(root, "hugechunk", [2**40, 2**40], [2**40, 2**40])  # a chunk no TIFF holds
    _array(root, "manypages", [2**20, 2**20, 2**20], [2**20, 2**20, 2**20], "uint64")
    return root


def many_tiles_store(root: Path, edge: int = 2**21) -> Path:
    """One edge x edge uint16 array of 256 x 256 chunks: 2**26 tiles at 2**21."""
    _group(root)
    _array(root, "big", [edge, edge], [256, 256])
    return root


def deep_store(root: Path) -> Path:
    """Members whose metadata is nested too deep (v3 and v2) or too large."""
    _group(root)
    (root / "deep").mkdir()
    (root / "deep" / "zarr.json").write_text("[" * 5000 + "]" * 5000)  # valid JSON, 10 KB
    (root / "deepattrs").mkdir()
    (root / "deepattrs" / "zarr.json").write_text(
        '{"zarr_format": 3, "node_type": "group", "attributes": {"a": ' + "[" * 500 + "]" * 500 + "}}")
    (root / "v2deep").mkdir()
    (root / "v2deep" / ".zarray").write_text(json.dumps(
        {"zarr_format": 2, "shape": [8], "chunks": [8], "dtype": "<u2", "compressor": None,
         "fill_value": 0, "filters": None, "order": "C"}))
    (root / "v2deep" / ".zattrs").write_text('{"a": ' + "{" * 3000 + "}" * 3000 + "}")
    (root / "large").mkdir()
    (root / "large" / "zarr.json").write_text('{"x": "' + "a" * MAX_METADATA_BYTES + '"}')
    return root


def _sharded(root: Path, name: str, shape: list[int], shard: list[int], inner: list[int], stored: bytes) -> None:
    """A uint8 array of one shard (crc32c index) whose stored bytes are `stored`."""
    _array(root, name, shape, shard, "uint8")
    doc = json.loads((root / name / "zarr.json").read_text())
    doc["codecs"] = [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": inner, "codecs": [{"name": "bytes"}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]
    (root / name / "zarr.json").write_text(json.dumps(doc))
    (root / name / "c" / "0").mkdir(parents=True)
    (root / name / "c" / "0" / "0").write_bytes(stored)


def bounds_store(root: Path) -> Path:
    """Members small on disk whose metadata costs zarr-python time or memory out of
    proportion (rank, codec count, a v2 element of 1.5 GB), attributes that are no
    object, and OME-Zarr multiscales of the wrong JSON types (which must cost only
    their OME decoration, never the store)."""
    _group(root)
    _array(root, "rank33", [1] * 33, [1] * 33)
    _array(root, "codecs65", [8], [8])
    doc = json.loads((root / "codecs65" / "zarr.json").read_text())
    doc["codecs"] += [{"name": "crc32c"}] * 65
    (root / "codecs65" / "zarr.json").write_text(json.dumps(doc))
    _array(root, "attrlist", [8], [8])
    doc = json.loads((root / "attrlist" / "zarr.json").read_text())
    doc["attributes"] = [1, 2]
    (root / "attrlist" / "zarr.json").write_text(json.dumps(doc))
    for name, dtype in (("void", "|V1500000000"), ("record", [["a", "|V1500000000"]])):
        (root / name).mkdir()
        (root / name / ".zarray").write_text(json.dumps(
            {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": dtype, "compressor": None,
             "fill_value": None, "filters": None, "order": "C"}))
    (root / "v2attrlist").mkdir()
    (root / "v2attrlist" / ".zarray").write_text(json.dumps(
        {"zarr_format": 2, "shape": [8], "chunks": [8], "dtype": "<u2", "compressor": None,
         "fill_value": 0, "filters": None, "order": "C"}))
    (root / "v2attrlist" / ".zattrs").write_text("[1, 2]")
    _sharded(root, "bigshard", [2**20, 2**20], [2**20, 2**20], [1, 1], random.Random(0).randbytes(100))
    (root / ".zfuse").mkdir()
    (root / ".zfuse" / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    _array(root / ".zfuse", "stats", [8], [8])
    _sharded(root, "badshard", [16, 16], [16, 16], [8, 8], random.Random(1).randbytes(300))
    _array(root, "v1big", [4096, 4096], [1, 1], "uint8")
    doc = json.loads((root / "v1big" / "zarr.json").read_text())
    doc["storage_transformers"] = [{"name": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
                                    "type": "indexed", "configuration": {"chunks_per_shard": [4096, 4096]}}]
    (root / "v1big" / "zarr.json").write_text(json.dumps(doc))
    _array(root, "empty", [0, 16], [8, 8])
    (root / "pyr").mkdir()
    (root / "pyr" / "zarr.json").write_text(json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": {"ome": {
            "version": "0.5", "multiscales": [{"axes": [{"name": "y"}, {"name": "x"}],
                                               "datasets": [{"path": "0"}, {"path": "1"}]}]}}}))
    _array(root / "pyr", "0", [2, 2], [2, 2])
    _array(root / "pyr", "1", [0, 0], [2, 2])
    crafted = {"axes5": {"axes": 5}, "ct7": {"coordinateTransformations": 7},
               "datasets5": {"datasets": 5},
               "huge_scale": {"datasets": [{"path": "0", "coordinateTransformations": [
                   {"type": "scale", "scale": [10**400, 1]}]}]}}
    for name, multiscale in crafted.items():
        (root / name).mkdir()
        (root / name / "zarr.json").write_text(json.dumps(
            {"zarr_format": 3, "node_type": "group", "attributes": {"ome": {
                "version": "0.5", "multiscales": [{"axes": [{"name": "y"}, {"name": "x"}],
                                                   "datasets": [{"path": "0"}], **multiscale}]}}}))
        _array(root / name, "0", [16, 16], [8, 8])
    return root


def _info(source: Path) -> dict:
    return describe_source(MountConfig([str(source)], "/unused", read_only=True))


def _info_text(source: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zfuse.cli", "info", str(source)],
                          capture_output=True, text=True, timeout=120)


# -- plain calls -------------------------------------------------------------------------


def test_metadata_depth_and_size_limits() -> None:
    assert nesting_depth(b'{"a": [1, {"b": "[[[[[[[[[["}], "c": "\\"]]]"}') == 3
    assert nesting_depth(b"7") == 0
    assert metadata_problem(b"[" * MAX_METADATA_DEPTH + b"]" * MAX_METADATA_DEPTH, "k") is None
    deep = metadata_problem(b"[" * (MAX_METADATA_DEPTH + 1) + b"]" * (MAX_METADATA_DEPTH + 1), "a/zarr.json")
    assert deep is not None and "a/zarr.json nests 65 levels" in deep
    big = metadata_problem(b" " * (MAX_METADATA_BYTES + 1), "a/zarr.json")
    assert big is not None and "bytes" in big


def test_real_ome_zarr_metadata_is_well_within_the_depth_limit() -> None:
    """Every metadata document of the third-party test data (OME-Zarr from ome-zarr-py,
    zarrs, zarr-java, ...) nests at most a third of the limit."""
    third = Path(__file__).resolve().parent.parent.parent / "shared" / "thirdparty-zarr"
    docs = [p for name in ("zarr.json", ".zattrs", ".zarray", ".zmetadata") for p in third.rglob(name)]
    if not docs:
        pytest.skip("no third-party data here")
    deepest = max(nesting_depth(p.read_bytes()) for p in docs[:5000])
    assert deepest <= MAX_METADATA_DEPTH // 3, deepest


def test_huge_shapes_cost_only_their_whole_image_or_their_array(tmp_path: Path) -> None:
    """Shapes past 2**32 pixels across or 2**63 bytes: no whole-image file (why: in
    `zfuse info`), the chunk files as usual; chunks no TIFF holds: the array is not
    shown, with its reason. `zfuse info` of the store lists every array."""
    store = huge_store(tmp_path / "h.zarr")
    started = time.perf_counter()
    report = _info(store)
    assert time.perf_counter() - started < 20
    arrays = {a["path"]: a for a in report["arrays"]}
    assert set(arrays) == {"good", "big40", "big62", "big63", "planes62", "hugechunk", "manypages"}
    for name in ("good", "big40", "big62", "big63", "planes62"):
        assert arrays[name]["shown"], name
    assert "at most 4294967295 pixels" in arrays["hugechunk"]["why_not"]
    assert "at most 65536 pages" in arrays["manypages"]["why_not"]
    images = {f["path"] for f in report["whole_image_files"]}
    assert images == {"good/image.ome.tif", "good/image.tif"}
    skipped = {f["path"]: f["reason"] for f in report["whole_image_files_not_shown"]}
    assert set(skipped) == {"big40", "big62", "big63", "planes62"}
    assert "at most 4294967295 pixels high and wide" in skipped["big40"]
    assert "past the largest file size" in skipped["planes62"]
    # the views: every size a stat would report fits an off_t
    view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
    for _, arr in view.arrays():
        if arr.layout is not None:
            assert arr.layout.file_size <= 2**63 - 1
    assert view.entry(("big62", "c", str(2**54 - 1))) is not None  # the last row of chunks ([tree-4])
    assert view.entry(("hugechunk", "README")) is not None


def test_whole_image_of_millions_of_tiles_is_planned_and_read_in_bounded_memory(tmp_path: Path) -> None:
    """2**26 tiles: planning, `zfuse info` and reading the header cost what is read,
    not the tile count (before: 6.2 GB and 5.8 s for the first MiB)."""
    store = many_tiles_store(tmp_path / "m.zarr")
    view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
    img = view.whole_images(("big",))["image.ome.tif"]
    assert img.header_size > 2**30 and img.tiles == 2**26
    started = time.perf_counter()
    head = img.read(0, 1 << 20)
    assert time.perf_counter() - started < 5
    assert img._header is None  # never built whole
    big = img.levels[0]
    # TileOffsets of tile 2**25 + 5, read from where the header says they are
    # BigTIFF, its first IFD at 16: its entries, read by hand
    assert head[:4] == b"II+\0" and int.from_bytes(head[8:16], "little") == 16
    n = int.from_bytes(head[16:24], "little")
    entries = {int.from_bytes(head[24 + 20 * i:26 + 20 * i], "little"): head[24 + 20 * i:44 + 20 * i]
               for i in range(n)}
    offsets_at = int.from_bytes(entries[324][12:20], "little")
    tile = 2**25 + 5
    raw = img.read(offsets_at + 8 * tile, 8)
    assert int.from_bytes(raw, "little") == img.slot_offset(0, 0, tile) == img.data_start + tile * big.slot
    counts_at = int.from_bytes(entries[325][12:20], "little")
    assert int.from_bytes(img.read(counts_at + 8 * tile, 8), "little") == big.tile_bytes
    assert len(img.read(img.header_size - 100, 200)) == 200


def test_rendered_header_ranges_equal_the_whole_header(tmp_path: Path, monkeypatch) -> None:
    """A header rendered by range (as for big images) is byte for byte the whole one."""
    store = many_tiles_store(tmp_path / "m.zarr", edge=256 * 40)
    view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
    img = view.whole_images(("big",))["image.ome.tif"]
    full = img.header()
    monkeypatch.setattr(whole_image, "_HEADER_KEPT", 0)
    img._header = None
    rng = random.Random(5)
    for _ in range(300):
        a = rng.randrange(img.header_size)
        b = min(img.header_size, a + rng.randrange(1, 20000))
        assert img.header_bytes(a, b) == full[a:b], (a, b)


def test_metadata_too_deep_or_large_hides_only_its_member(tmp_path: Path) -> None:
    """Nested 5,000 deep (v3 zarr.json, a v2 .zattrs) or 500 deep, or past 16 MiB: that
    member is not shown, with the reason; the rest of the store is."""
    store = deep_store(tmp_path / "d.zarr")
    report = _info(store)
    arrays = {a["path"]: a for a in report["arrays"]}
    assert arrays["good"]["shown"]
    why = {p["path"]: p["reason"] for p in report["not_shown"]}
    assert "deep/zarr.json nests 5000 levels deep" in why["deep"]
    assert "deepattrs/zarr.json nests 502 levels deep" in why["deepattrs"]
    assert "v2deep/.zattrs nests 3001 levels deep" in why["v2deep"]
    assert f"at most {MAX_METADATA_BYTES} bytes" in why["large"]
    view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
    readme = view.entry(("deep", "README"))
    assert readme is not None


def test_a_huge_sparse_metadata_document_is_never_read(tmp_path: Path) -> None:
    """[hostile-3] a member whose zarr.json is a sparse GiB (a root's too, and a v2
    .zattrs): refused from its size, nothing read (it was read whole, 4 GB, before the
    16 MiB bound was looked at; a mount under 4 GB failed with MemoryError); the member
    is not shown with the reason, the rest of the store is."""
    import tracemalloc

    import zarr

    store = tmp_path / "g.zarr"
    zarr.open_group(str(store), mode="w")
    zarr.create_array(str(store / "good"), shape=(4,), chunks=(4,), dtype="u1", fill_value=0)
    (store / "huge").mkdir()
    with open(store / "huge" / "zarr.json", "wb") as f:
        f.truncate(1 << 30)
    tracemalloc.start()
    try:
        view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, peak
    why = {p.path: p.reason for p in view.problems}
    assert f"huge/zarr.json is {1 << 30} bytes: zfuse reads metadata documents of at most" in why["huge"], why
    assert view.entry(("good", "zarr.json")) is not None


def test_a_root_document_past_the_bounds_is_refused_saying_why(tmp_path: Path) -> None:
    """[hostile-3] a store whose root zarr.json nests 100,000 deep (an array's too, opened
    by path) is refused naming the bound (it was a RecursionError from the pre-release
    layout check, or zarr-python's "no group found")."""
    from zfuse.errors import MetadataError

    for doc in ('{"zarr_format": 3, "node_type": "group", "attributes": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}",
                '{"zarr_format": 3, "node_type": "array", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"):
        (tmp_path / "r.zarr").mkdir(exist_ok=True)
        (tmp_path / "r.zarr" / "zarr.json").write_text(doc)
        with pytest.raises(MetadataError, match=r"zarr.json nests 10000\d levels deep"):
            make_view(MountConfig([str(tmp_path / "r.zarr")], "/unused", read_only=True), Stats())


def test_metadata_past_zfuse_bounds_hides_only_its_member(tmp_path: Path) -> None:
    """[hostile-11] 33 dimensions, 65 codecs, a v2 element of 1.5 GB (which zarr-python would
    allocate as the fill value), attributes that are a JSON list: that member is not
    shown, with the reason, before zarr-python parses it. OME-Zarr multiscales whose
    fields are the wrong JSON types (axes: 5, a 400-digit scale) cost only the OME
    reading of that group: the store and its arrays are shown."""
    store = bounds_store(tmp_path / "b.zarr")
    report = _info(store)
    why = {p["path"]: p["reason"] for p in report["not_shown"]}
    assert "33 dimensions: zfuse reads arrays of at most 32" in why["rank33"]
    assert "66 codecs: zfuse reads lists of at most 64" in why["codecs65"]
    assert "attributes are a JSON list, not an object" in why["attrlist"]
    assert "is 1500000000 bytes: zfuse reads elements of at most" in why["void"]
    assert "is 1500000000 bytes" in why["record"]
    assert "v2attrlist/.zattrs holds a JSON list" in why["v2attrlist"]
    # a shard of 2**40 inner chunks (a 16 TiB index) listed 2**20 row directories, each
    # failing; a sharding-v1 index of 256 MiB was read for every chunk read
    assert "each shard's index is 17592186044416 bytes, more than the shard index cache" in why["bigshard"]
    assert "an index of 268435456 bytes, read for every chunk" in why["v1big"]
    # one corrupt shard index costs that array's count of chunk files, not the report
    bad = next(a for a in report["arrays"] if a["path"] == "badshard")
    assert bad["files"] is None and "unreadable shard index" in bad["files_error"]
    shown = {a["path"] for a in report["arrays"] if a["shown"]}
    assert {"good", "axes5/0", "ct7/0", "datasets5/0", "huge_scale/0"} <= shown
    # an empty array had an image.ome.tif 0 pixels wide (tifffile divides by it)
    no_image = {f["path"]: f["reason"] for f in report["whole_image_files_not_shown"]}
    assert "the array is empty (shape (0, 16))" in no_image["empty"]
    assert "multiscale dataset '1' is not an array with chunk files and pixels here" in no_image["pyr"]
    assert {"empty", "pyr", "pyr/1"}.isdisjoint(f["path"] for f in report["whole_image_files"])
    # a member named as the mount's own directory was merged into it (`stats` listed twice)
    assert not any(a["path"].startswith(".zfuse") for a in report["arrays"])
    view = make_view(MountConfig([str(store)], "/unused", read_only=True), Stats())
    assert ".zfuse" not in [name for name, _ in view.list_dir(())]
    for name in ("axes5", "ct7", "datasets5", "huge_scale"):
        assert view.entry((name, "0", "image.ome.tif")) is not None, name
    assert view.entry(("void", "README")) is not None


def test_consolidated_metadata_past_zfuse_bounds_is_not_used(tmp_path: Path) -> None:
    """[hostile-11] zarr-python opens members from a group's consolidated metadata
    without reading their own documents: one entry past zfuse's bounds (65 codecs in a
    v3 group's, a 1.5 GB v2 element in a `.zmetadata`) and the consolidated metadata is
    not used (logged); the store is listed, and the member refused from its own document."""
    root = tmp_path / "c.zarr"
    _group(root)
    _array(root, "codecs65", [8], [8])
    doc = json.loads((root / "codecs65" / "zarr.json").read_text())
    doc["codecs"] += [{"name": "crc32c"}] * 65
    (root / "codecs65" / "zarr.json").write_text(json.dumps(doc))
    group = json.loads((root / "zarr.json").read_text())
    group["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": {
        "codecs65": doc, "good": json.loads((root / "good" / "zarr.json").read_text())}}
    (root / "zarr.json").write_text(json.dumps(group))
    report = _info(root)
    why = {p["path"]: p["reason"] for p in report["not_shown"]}
    assert "66 codecs" in why["codecs65"]
    assert {"good"} <= {a["path"] for a in report["arrays"] if a["shown"]}
    v2 = tmp_path / "v2.zarr"
    v2.mkdir()
    (v2 / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    void = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "|V1500000000", "compressor": None,
            "fill_value": None, "filters": None, "order": "C"}
    (v2 / "void").mkdir()
    (v2 / "void" / ".zarray").write_text(json.dumps(void))
    (v2 / ".zmetadata").write_text(json.dumps({"zarr_consolidated_format": 1, "metadata": {
        ".zgroup": {"zarr_format": 2}, "void/.zarray": void}}))
    report = _info(v2)
    why = {p["path"]: p["reason"] for p in report["not_shown"]}
    assert "is 1500000000 bytes" in why["void"]
    # an entry's own consolidated metadata (a subgroup's) is parsed too: checked as well
    from zfuse.ext.metadata_json import consolidated_problem

    nested = {"zarr_format": 3, "node_type": "group", "consolidated_metadata": {"metadata": {
        "sub": {"zarr_format": 3, "node_type": "group", "consolidated_metadata": {"metadata": {
            "deep": doc}}}}}}
    assert "66 codecs" in (consolidated_problem(nested, "zarr.json") or "")


# -- real mounts ----------------------------------------------------------------------


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _alive(m) -> None:
    os.stat(m.path / ".zfuse" / "stats")
    assert json.loads((m.path / ".zfuse" / "stats").read_bytes())


def _good_reads(m) -> None:
    values = tifffile.imread(m.path / "good" / "c" / "1" / "0.tiff")
    assert (values == 7).all()
    whole = tifffile.imread(m.path / "good" / "image.ome.tif")
    assert whole.shape == (64, 64) and (whole[32:, :32] == 7).all() and (whole[:32] == 0).all()


@pytest.mark.mount
def test_mount_of_huge_shapes_survives_listing_them(tmp_path: Path, mount) -> None:
    """[hostile-1] `ls -l` of arrays of shape [2**40, 2**40], [2**62, 2**62] and
    [2**63-1, 2] (before: the daemon died, "Software caused connection abort"):
    their directories list without `image.ome.tif`, chunk files stat, the array
    whose chunks no TIFF holds has a README; the daemon answers, stays under 1 GiB,
    its good array reads normally, `zfuse info` names every array."""
    store = huge_store(tmp_path / "h.zarr")
    m = mount(store, "-o", "ro")
    for name in ("big40", "big62", "big63", "planes62"):
        listed = subprocess.run(["ls", "-l", str(m.path / name)], capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "image.ome.tif" not in listed.stdout and "zarr.json" in listed.stdout
        _alive(m)
    assert not (m.path / "big62" / "image.ome.tif").exists()
    assert os.listdir(m.path / "big62" / "c" / str(2**54 - 1)) == []  # the last row: nothing stored
    assert sorted(os.listdir(m.path / "hugechunk")) == ["README", "zarr.json"]
    assert "at most 4294967295 pixels" in (m.path / "hugechunk" / "README").read_text()
    meta = json.loads((m.path / "manypages" / "zarr.json").read_text())
    assert "65536 pages" in meta["attributes"]["zfuse"]["unsupported"]
    subprocess.run(["ls", "-lR", str(m.path)], capture_output=True, timeout=60)  # all of it, nothing dies
    _alive(m)
    _good_reads(m)
    assert _peak_rss(m.pid) < GIB
    info = _info_text(store)
    assert info.returncode == 0, info.stderr
    for name in ("good", "big40", "big62", "big63", "hugechunk", "manypages"):
        assert f"array {name}\n" in info.stdout + "\n"
    assert "no whole-image file in big62: " in info.stdout
    assert "Traceback" not in m.log()


@pytest.mark.mount
def test_mount_reads_the_header_of_a_whole_image_of_millions_of_tiles(tmp_path: Path, mount) -> None:
    """[hostile-2] the first MiB of `image.ome.tif` of a [2**21, 2**21] array of
    256 x 256 chunks (2**26 tiles; before: 5.8 s and 6.2 GB): the daemon's peak RSS
    stays under 1 GiB, tifffile reads the tiling from the header, `zfuse info` too."""
    store = many_tiles_store(tmp_path / "m.zarr")
    m = mount(store, "-o", "ro")
    f = m.path / "big" / "image.ome.tif"
    assert os.stat(f).st_size > 2**43
    started = time.perf_counter()
    with open(f, "rb") as fh:
        assert len(fh.read(1 << 20)) == 1 << 20
        fh.seek(os.stat(f).st_size // 2)
        assert len(fh.read(4096)) == 4096  # a tile: the fill value
    assert time.perf_counter() - started < 30
    _alive(m)
    _good_reads(m)
    assert _peak_rss(m.pid) < GIB
    info = _info_text(store)
    assert info.returncode == 0 and "67108864 tiles" in info.stdout, info.stderr


@pytest.mark.mount
def test_mount_shows_a_store_with_metadata_too_deep(tmp_path: Path, mount) -> None:
    """[hostile-3] members whose metadata nests 5,000 (or 500, or a v2 .zattrs 3,000)
    deep, or is past 16 MiB (before: mount and info failed with RecursionError): each
    is a directory with its README naming the document and the limit; the good
    array reads, `zfuse info` lists it and names the bad ones."""
    store = deep_store(tmp_path / "d.zarr")
    m = mount(store, "-o", "ro")
    for name, text in (("deep", "nests 5000 levels deep"), ("v2deep", "nests 3001 levels deep"),
                       ("large", f"at most {MAX_METADATA_BYTES} bytes")):
        assert "README" in os.listdir(m.path / name)
        assert text in (m.path / name / "README").read_text()
    _alive(m)
    _good_reads(m)
    assert _peak_rss(m.pid) < GIB
    info = _info_text(store)
    assert info.returncode == 0, info.stderr
    assert "array good\n" in info.stdout and "nests 5000 levels deep" in info.stdout


def test_fuse_adapter_answers_unforeseen_errors_instead_of_dying(caplog) -> None:
    """An exception that is not an FsError (the st_size overflow that ended the daemon
    with "Exceptions from Trio nursery") is a FUSEError, EOVERFLOW or EIO, logged
    with the path the request was about."""
    import errno
    import logging
    from types import SimpleNamespace

    from zfuse.fuse_ops import _unexpected

    paths = {5: ("big62", "image.ome.tif")}
    ops = SimpleNamespace(fs=SimpleNamespace(inodes=SimpleNamespace(path_of=paths.get), handles={}, _dirs={}))
    with caplog.at_level(logging.ERROR, logger="zfuse.fuse"):
        err = _unexpected(ops, "getattr", (5,), OverflowError("int too big to convert"))
        assert err.errno == errno.EOVERFLOW
        err = _unexpected(ops, "lookup", (1, b"x"), RuntimeError("bug"))
        assert err.errno == errno.EIO
    assert "getattr(5) on /big62/image.ome.tif" in caplog.text and "EOVERFLOW" in caplog.text
    assert "lookup(1, 'x') on an unknown path" in caplog.text


def test_a_request_whose_error_cannot_be_logged_is_still_answered() -> None:
    """Memory exhausted (a listing of millions of names): the request fails with ENOMEM,
    and so does logging why; the reply still goes out (the mount had hung, every later
    request unanswered)."""
    import errno
    import logging
    from types import SimpleNamespace

    import pyfuse3
    import trio

    from zfuse.fuse_ops import _fuse_errors

    class Exhausted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise MemoryError

        def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
            raise MemoryError

    @_fuse_errors
    async def readdir(self: object, fh: int) -> None:
        raise MemoryError

    ops = SimpleNamespace(fs=SimpleNamespace(inodes=SimpleNamespace(path_of={}.get), handles={}, _dirs={}))
    logger = logging.getLogger("zfuse.fuse")
    handler = Exhausted()
    logger.addHandler(handler)
    try:
        with pytest.raises(pyfuse3.FUSEError) as answered:
            trio.run(readdir, ops, 7)
    finally:
        logger.removeHandler(handler)
    assert answered.value.errno == errno.ENOMEM


@pytest.mark.mount
def test_mount_of_a_group_of_50000_members_opens_only_those_looked_up(tmp_path: Path, mount) -> None:
    """[hostile-4] a group of 50,000 array directories (before: the mount opened every
    one, 15 KB and a metadata read each): the mount and `ls` of the group cost its
    listing; the members looked up are opened, and only they; the daemon stays small."""
    store = _group(tmp_path / "m.zarr")
    meta = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 3, "codecs": [{"name": "bytes"}], "attributes": {}}
    doc = json.dumps(meta)
    names = [f"a{i:05d}" for i in range(50_000)]
    for name in names:
        os.mkdir(store / name)
        (store / name / "zarr.json").write_text(doc)
    m = mount(store, "-o", "ro")
    opened = lambda: json.loads((m.path / ".zfuse" / "stats").read_bytes()).get("group_members_opened", 0)  # noqa: E731
    assert opened() == 0
    listed = set(os.listdir(m.path))
    assert listed >= {*names, "good", "zarr.json"} and opened() == 0
    assert json.loads((m.path / "a31337" / "zarr.json").read_bytes())["shape"] == [4]
    assert (tifffile.imread(m.path / "a00007" / "image.ome.tif") == 3).all()
    _good_reads(m)
    assert opened() == 16 + 16 + 1  # each with the names after it (up to MEMBERS_OPENED_AHEAD)
    assert _peak_rss(m.pid) < 400 * 2**20  # (81 MB here; opening them all: 26 s at mount)
    assert "Traceback" not in m.log()


@pytest.mark.mount
def test_mount_of_a_store_nested_300_levels_deep(tmp_path: Path, mount) -> None:
    """[hostile-6] 300 nested directories (before: RecursionError while the mount opened
    them, and no mount): the mount is live, `find` walks it, what lies more than
    DEPTH_MAX levels down is a directory with a README saying why."""
    store = _group(tmp_path / "deep.zarr")
    stray = store / "/".join(["d"] * 300)
    stray.mkdir(parents=True)
    (stray / "x").write_bytes(b"stray")
    m = mount(store, "-o", "ro")
    _good_reads(m)
    found = subprocess.run(["find", str(m.path / "d")], capture_output=True, text=True, check=True)
    readmes = [line for line in found.stdout.splitlines() if line.endswith("/README")]
    assert len(readmes) == 1 and readmes[0].count("/d") == 65
    assert "more than 64 levels" in Path(readmes[0]).read_text()
    assert "Traceback" not in m.log()


@pytest.mark.mount
def test_find_over_many_members_holds_a_bounded_number_opened(tmp_path: Path, mount) -> None:
    """[hostile-5] `find` over 40 groups of 40 arrays (small groups, each opened whole
    when listed) with `-o members_kept=200`: every path is found, the daemon holds at
    most about 200 members opened at any time (before: all 1,640, about 15 KB each, so
    a crafted store of a million cost 15 GB), and a member forgotten on the way reads
    as before when looked up again."""
    store = _group(tmp_path / "n.zarr")
    meta = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 3, "codecs": [{"name": "bytes"}], "attributes": {}}
    group = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})
    for g in range(40):
        os.mkdir(store / f"g{g:02d}")
        (store / f"g{g:02d}" / "zarr.json").write_text(group)
        for a in range(40):
            os.mkdir(store / f"g{g:02d}" / f"a{a:02d}")
            (store / f"g{g:02d}" / f"a{a:02d}" / "zarr.json").write_text(json.dumps({**meta, "fill_value": a}))
    m = mount(store, "-o", "ro", "-o", "members_kept=200")
    stats = lambda: json.loads((m.path / ".zfuse" / "stats").read_bytes())  # noqa: E731
    held = []
    for g in range(40):  # `find`, one group at a time, watching what the daemon holds
        found = subprocess.run(["find", str(m.path / f"g{g:02d}")], capture_output=True, text=True, check=True)
        assert sum(line.endswith("/zarr.json") for line in found.stdout.splitlines()) == 41
        held.append(stats()["group_members_held"])
    assert max(held) <= 200 + 40 + 1 and stats()["group_members_forgotten"] > 0
    assert (tifffile.imread(m.path / "g00" / "a07" / "image.ome.tif") == 7).all()  # forgotten, opened again
    _good_reads(m)
    assert "Traceback" not in m.log()


@pytest.mark.mount
def test_mount_of_a_store_past_zfuse_bounds(tmp_path: Path, mount) -> None:
    """[hostile-11] [hostile-12] [hostile-13] On a mount: members past zfuse's bounds
    are directories with a README, the rest reads; a root member named `.zfuse` is not
    merged into the mount's own directory; links to the store's root are not listed; a
    sparse terabyte as a chunk and a FIFO as a chunk fail their reads with EIO at once."""
    import errno as errno_mod

    store = bounds_store(tmp_path / "b.zarr")
    (store / "loop").symlink_to(".")
    with open(store / "good" / "c" / "1" / "1", "wb") as f:
        f.truncate(2**40)
    (store / "good" / "c" / "0").mkdir()
    os.mkfifo(store / "good" / "c" / "0" / "1")
    m = mount(store)
    names = os.listdir(m.path)
    assert "loop" not in names and "good" in names
    assert sorted(os.listdir(m.path / ".zfuse")).count("stats") == 1
    assert "33 dimensions" in (m.path / "rank33" / "README").read_text()
    assert "holds a JSON list" in (m.path / "v2attrlist" / "README").read_text()
    for chunk in (m.path / "good" / "c" / "1" / "1.tiff", m.path / "good" / "c" / "0" / "1.tiff"):
        with pytest.raises(OSError) as e:
            chunk.read_bytes()
        assert e.value.errno == errno_mod.EIO, chunk
    values = tifffile.imread(m.path / "good" / "c" / "1" / "0.tiff")
    assert (values == 7).all()
    _alive(m)



def test_nested_sharding_is_not_shown(tmp_path: Path) -> None:
    """[hostile-12] a sharding codec inside a shard's codecs: zarr's pipeline decodes the
    inner shards whole, each inner chunk allocating what its stream declares (a 2 KB
    shard whose index entries all point at one zstd frame declaring 48 MiB took the
    daemon to 3.5 GB): the array is shown with a README saying why, its neighbours as
    usual."""
    import zarr
    from zarr.codecs import ShardingCodec

    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    nested = root.create_array("nested", shape=(8, 8), chunks=(4, 4), dtype="u1", fill_value=0,
                               serializer=ShardingCodec(chunk_shape=(2, 2), codecs=[ShardingCodec(chunk_shape=(1, 1))]))
    nested[...] = 1
    root.create_array("plain", shape=(8, 8), chunks=(4, 4), dtype="u1", fill_value=0)[...] = 2
    view = make_view(MountConfig([str(tmp_path / "g.zarr")], "/unused", read_only=True), Stats())
    view.list_dir(())
    why = {p.path: p.reason for p in view.problems}
    assert "nested sharding" in why["nested"] and "cannot bound" in why["nested"]
    assert dict(view.arrays())[("plain",)].pixel_bytes((0, 0))
