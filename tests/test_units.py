"""Physical units, FUSE-free: one table (`zfuse/view/units.py`) for the chunk files'
ImageJ calibration, the whole-image files' OME-XML and OpenSlide's microns per pixel.

What a reader is told must be right in every reader: Bio-Formats (Fiji's importer,
QuPath) reads an ImageJ TIFF's calibration as micrometres and seconds whatever unit
its description names, so chunk files state known units so; OME-XML states a size
with its unit, or not at all when zfuse does not know the unit (a bare size is read
as micrometres or seconds). These were wrong by 1000x and more for nanometre,
millisecond, picosecond and day axes, and for unit symbols ("nm", "ms")."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import pytest
import tifffile

from zfuse.view.ome_zarr import fitted_ome, ome_axes, ome_datasets
from zfuse.view.tiff import build_header, plan_layout
from zfuse.view.units import micrometres, seconds, unit_of
from zfuse.view.whole_image.ome import ome_xml

OME = "{http://www.openmicroscopy.org/Schemas/OME/2016-06}"


def test_unit_names_spellings_and_symbols() -> None:
    """OME-Zarr's names (UDUNITS-2, any case, plural), OME's symbols in their own case
    ("Mm" a megametre, "mm" a millimetre), ImageJ's and ASCII spellings of micro."""
    for text, size in (("nanometer", 1e-3), ("Nanometers", 1e-3), ("nm", 1e-3), ("micron", 1.0), ("um", 1.0),
                       ("\u00b5m", 1.0), ("\u03bcm", 1.0), ("micrometre", 1.0), ("angstrom", 1e-4),
                       ("\u00c5", 1e-4), ("mm", 1e3), ("Mm", 1e12), ("inch", 25400.0), ("pm", 1e-6)):
        assert micrometres(1, text) == pytest.approx(size), text
    for text, size in (("millisecond", 1e-3), ("ms", 1e-3), ("Ms", 1e6), ("picosecond", 1e-12), ("ps", 1e-12),
                       ("day", 86400.0), ("d", 86400.0), ("minute", 60.0), ("h", 3600.0), ("sec", 1.0),
                       ("seconds", 1.0), ("us", 1e-6)):
        assert seconds(1, text) == pytest.approx(size), text
    for text in ("furlong", "MS", "NM", "", None, 3, "m" * 40, "pixel"):
        assert unit_of(text) is None, text
    assert micrometres(2, "second") is None and seconds(2, "meter") is None  # the wrong kind
    assert micrometres(float("nan"), "nm") is None and micrometres(-1, "nm") is None


def _calibration(units: list, scales: list, axes: str = "tzyx") -> tuple[dict, tuple[float, float]]:
    layout = plan_layout((1, 3, 4, 5), "u2", axes=axes, axis_types=None, scales=scales, units=units)
    header = build_header(layout, (0, 0, 0, 0))
    with tifffile.TiffFile(io.BytesIO(header)) as tif:
        num, den = tif.pages[0].tags["XResolution"].value
        ynum, yden = tif.pages[0].tags["YResolution"].value
        return tif.imagej_metadata, (den / num, yden / ynum)


def test_chunk_files_state_known_units_in_micrometres_and_seconds() -> None:
    """[read-14] nm pixels, a µm z step and ms frames: pixel size, spacing and frame interval in
    micrometres and seconds, one unit for x, y and z (z's was said in x's unit: 2 nm)."""
    ij, (x, y) = _calibration(["millisecond", "micrometer", "nanometer", "nanometer"], [30, 2.0, 650, 325])
    assert ij["unit"] == "micron" and (x, y) == (pytest.approx(0.325), pytest.approx(0.65))
    assert ij["spacing"] == pytest.approx(2.0) and "zunit" not in ij and "yunit" not in ij
    assert ij["finterval"] == pytest.approx(0.03) and ij["tunit"] == "sec"
    ij, (x, _) = _calibration(["d", "nm", "\u00c5", "\u00c5"], [0.5, 50, 40, 40])
    assert ij["unit"] == "micron" and x == pytest.approx(0.004) and ij["spacing"] == pytest.approx(0.05)
    assert ij["finterval"] == pytest.approx(43200.0)


def test_units_not_known_are_named_as_the_store_names_them() -> None:
    """ImageJ shows a unit zfuse does not know; z in another unit than x says its own."""
    ij, (x, _) = _calibration([None, "furlong", "furlong", "furlong"], [1, 2.0, 0.5, 0.5])
    assert ij["unit"] == "furlong" and x == pytest.approx(0.5) and ij["spacing"] == 2.0 and "zunit" not in ij
    ij, _ = _calibration([None, "furlong", "nanometer", "nanometer"], [1, 2.0, 500, 500])
    assert ij["unit"] == "micron" and ij["spacing"] == 2.0 and ij["zunit"] == "furlong"
    ij, _ = _calibration([None, None, None, None], [1, 2.0, 0.5, 0.5])  # no units said: none written
    assert "unit" not in ij and ij["spacing"] == 2.0


def _pixels(axes: list, units: list | None, scales: list, shape: tuple = (2, 3, 4, 5)) -> ET.Element:
    ome = {"axes": axes, "axis_types": None, "units": units, "scales": scales}
    xml = ome_xml("img", shape, "u2", ome, None)
    assert xml is not None
    pixels = ET.fromstring(xml).find(f"{OME}Image/{OME}Pixels")
    assert pixels is not None
    return pixels


def test_ome_xml_states_each_size_with_its_unit_or_not_at_all() -> None:
    """[read-14] [image-2] Any OME-Zarr unit with OME's symbol; a unit zfuse does not know leaves the size
    out (a bare one is read as micrometres or seconds: 48.8 ps had read as 48.8 s)."""
    p = _pixels(["t", "z", "y", "x"], ["picosecond", "micrometer", "nm", "nm"], [48.8, 2.0, 4.0, 4.0])
    got = {k: p.get(k) for k in ("TimeIncrement", "TimeIncrementUnit", "PhysicalSizeX", "PhysicalSizeXUnit",
                                 "PhysicalSizeZ", "PhysicalSizeZUnit")}
    assert got == {"TimeIncrement": "48.8", "TimeIncrementUnit": "ps", "PhysicalSizeX": "4.0",
                   "PhysicalSizeXUnit": "nm", "PhysicalSizeZ": "2.0", "PhysicalSizeZUnit": "\u00b5m"}
    p = _pixels(["t", "z", "y", "x"], ["day", "furlong", "ms", None], [0.5, 2.0, 4.0, 4.0])
    assert (p.get("TimeIncrement"), p.get("TimeIncrementUnit")) == ("0.5", "d")
    assert p.get("PhysicalSizeZ") is None  # not known
    assert p.get("PhysicalSizeY") is None  # a time unit on a length axis
    assert (p.get("PhysicalSizeX"), p.get("PhysicalSizeXUnit")) == ("4.0", None)  # no unit said: OME's default


def test_channel_axes_named_as_the_chunk_files_name_them() -> None:
    """xarray's `band` (and `bands`, `rgb`, ...) is OME's C, as in the chunk files (it was Z)."""
    for name in ("band", "bands", "rgb", "channel"):
        p = _pixels([name, "y", "x"], None, None, (3, 4, 5))
        assert (p.get("SizeC"), p.get("SizeZ")) == ("3", "1"), name


def test_every_multiscale_of_a_group_gives_its_datasets_their_axes() -> None:
    """[read-14] A group listing two multiscales (bioformats2raw-like): the second's levels have its
    axes and scales (they had the first's axes, and no scales)."""
    attrs = {"multiscales": [
        {"name": "a", "axes": [{"name": "c"}, {"name": "y"}, {"name": "x"}],
         "datasets": [{"path": "a0", "coordinateTransformations": [{"type": "scale", "scale": [1, 2, 2]}]}]},
        {"name": "b", "axes": [{"name": "z", "unit": "nanometer"}, {"name": "y"}, {"name": "x"}],
         "datasets": [{"path": "b0", "coordinateTransformations": [{"type": "scale", "scale": [50, 4, 4]}]}]},
    ], "omero": {"channels": [{"label": "DAPI"}]}}
    datasets = ome_datasets(attrs)
    assert datasets is not None
    assert datasets["b0"]["axes"] == ["z", "y", "x"] and datasets["b0"]["scales"] == [50, 4, 4]
    assert datasets["b0"]["image"]["name"] == "b" and datasets["a0"]["image"]["name"] == "a"
    assert datasets["a0"]["image"]["omero"] == {"channels": [{"label": "DAPI"}]}
    assert ome_axes(attrs, "other")["axes"] == ["c", "y", "x"]  # an array no multiscale lists: the first's


def test_ome_zarr_0_1_and_0_2_imply_tczyx() -> None:
    """OME-Zarr 0.1/0.2 name no axes: every array is (t, c, z, y, x), so channels are C
    (they were shown as Z); an array that is not 5-d is shown plain."""
    attrs = {"multiscales": [{"version": "0.2", "datasets": [{"path": "0"}]}]}
    ome = ome_axes(attrs, "0")
    assert ome["axes"] == ["t", "c", "z", "y", "x"]
    p = _pixels(ome["axes"], None, None, (1, 2, 1, 4, 5))
    assert (p.get("SizeC"), p.get("SizeZ")) == ("2", "1")
    assert fitted_ome(ome, 5)["axes"] == ome["axes"] and fitted_ome(ome, 3)["axes"] is None
    named = {"axes": ["c", "y", "x"], "implied": False}
    assert fitted_ome(named, 2) is named  # axes a store names are its own (refused where wrong)


def test_an_image_named_by_omero_where_its_multiscale_names_none() -> None:
    """[image-2] aicsimageio names its multiscale "/": the image's name is omero's."""
    from zfuse.view.whole_image.ome import multiscale_name

    attrs = {"multiscales": [{"name": "/", "datasets": [{"path": "0"}]}], "omero": {"name": "cells"}}
    assert multiscale_name(attrs) == "cells" and ome_datasets(attrs)["0"]["image"]["name"] == "cells"
    assert multiscale_name({"multiscales": [{"name": " ", "datasets": []}]}) is None


def test_review_cases_of_calibration() -> None:
    """[read-14] a z step of 10 km is stated in micrometres (only a pixel size is bound
    by what a TIFF resolution holds: it had kept the store's unit, read as 10 µm); a
    unit of the other kind states nothing (a time axis in nanometres had said
    `tunit=nanometer`); an empty unit is no unit (the size had been left out)."""
    ij, _ = _calibration([None, "kilometer", "meter", "meter"], [1, 10, 10, 10])
    assert ij["spacing"] == pytest.approx(1e10) and "zunit" not in ij and ij["unit"] == "micron"
    ij, _ = _calibration(["nanometer", "second", "nm", "nm"], [5, 2.0, 1, 1])
    assert "finterval" not in ij and "tunit" not in ij and "spacing" not in ij
    p = _pixels(["t", "z", "y", "x"], [None, None, "", ""], [1.0, 2.0, 4.0, 4.0])
    assert (p.get("PhysicalSizeX"), p.get("PhysicalSizeXUnit")) == ("4.0", None)


def test_ome_zarr_0_6_axes_are_those_of_the_system_the_datasets_lead_to() -> None:
    """[read-14] OME-Zarr 0.6: the coordinate system the datasets' scales name as their
    `output`, not the first listed (a "world" system in millimetres, x before y, had
    given a 10**6 calibration error, rows and columns swapped)."""
    attrs = {"ome": {"version": "0.6", "multiscales": [{
        "coordinateSystems": [
            {"name": "world", "axes": [{"name": "x", "unit": "millimeter"}, {"name": "y", "unit": "millimeter"}]},
            {"name": "physical", "axes": [{"name": "y", "unit": "nanometer"}, {"name": "x", "unit": "nanometer"}]}],
        "datasets": [{"path": "s0", "coordinateTransformations": [
            {"type": "scale", "scale": [65.0, 65.0], "input": "s0", "output": "physical"}]}]}]}}
    ome = ome_axes(attrs, "s0")
    assert ome["axes"] == ["y", "x"] and ome["units"] == ["nanometer", "nanometer"] and ome["scales"] == [65.0, 65.0]
    # the 0.6 schema's own spellings: `output` an object, a sequence of a scale and a translation
    ms = attrs["ome"]["multiscales"][0]
    for transform in ({"type": "scale", "scale": [65.0, 65.0], "input": "s0", "output": {"name": "physical"}},
                      {"type": "sequence", "input": "s0", "output": {"name": "physical"}, "transformations": [
                          {"type": "scale", "scale": [65.0, 65.0]}, {"type": "translation", "translation": [1, 1]}]}):
        ms["datasets"][0]["coordinateTransformations"] = [transform]
        ms["coordinateTransformations"] = [{"type": "scale", "scale": [1000.0, 1000.0], "output": "world"}]
        ome = ome_axes(attrs, "s0")
        assert ome["axes"] == ["y", "x"] and ome["scales"] == [65.0, 65.0], transform


def test_every_level_of_a_nested_multiscale_is_named_by_its_place() -> None:
    """[image-2] datasets `b/0` and `b/1`: "B, level 0" and "B, level 1" (both had been
    "B, level b")."""
    from zfuse.view.whole_image.image import _image_title

    datasets = ome_datasets({"multiscales": [{"name": "/B/", "datasets": [{"path": "b/0"}, {"path": "b/1"}]}]})
    assert [_image_title(("b", p), datasets[f"b/{p}"]["image"]) for p in ("0", "1")] == ["B, level 0", "B, level 1"]


def test_crafted_coordinate_systems_are_read_as_far_as_they_make_sense() -> None:
    """[hostile-8] OME-Zarr 0.6 attributes of the wrong JSON types (an `output` that is a
    list, transformations that are a number, systems that are strings): the axes of the
    first system that is one, or none; never an exception (it was a TypeError)."""
    for attrs in (
        {"multiscales": [{"coordinateSystems": [{"name": "p", "axes": [{"name": "y"}, {"name": "x"}]}],
                          "datasets": [{"path": "s0", "coordinateTransformations": [{"output": [1, 2]}]}]}]},
        {"multiscales": [{"coordinateSystems": [{"name": ["p"], "axes": [{"name": "y"}, {"name": "x"}]}],
                          "datasets": [{"path": "s0", "coordinateTransformations": -1}, 3]}]},
        {"ome": {"multiscales": [{"coordinateSystems": ["Mm", 1e308, {"name": "q", "axes": 5}], "datasets": None}]}},
    ):
        datasets = ome_datasets(attrs)
        assert datasets is not None and datasets[""]["axes"] in (["y", "x"], None)
