"""Arrays zarr-python reads are shown; arrays it cannot read never hide the rest.

The five cases of issue 10, by name, on the third-party data in
../shared/thirdparty-zarr/ (read-only), plus consolidated metadata that
disagrees with the store or cannot be parsed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

from test_thirdparty import THIRDPARTY, check_shown, reference

pytestmark = pytest.mark.mount

COMPAT_V2 = THIRDPARTY / "zarrs" / "zarr_python_compat_v2"
ZARRITA_V2 = THIRDPARTY / "zarrita.js" / "v2" / "data.zarr"
FIXTURE = THIRDPARTY / "zarr-python2-fixture"
SNAPSHOTS = THIRDPARTY / "zarrs_snapshot_data" / "supported" / "regular"


@pytest.fixture(autouse=True)
def _data() -> None:
    if not (THIRDPARTY / "SOURCES.md").is_file():
        pytest.fail(f"third-party Zarr data missing: {THIRDPARTY}")


def zfuse(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zfuse.cli", *args], capture_output=True, text=True, timeout=120)


def snapshot(pattern: str) -> Path:
    (found,) = SNAPSHOTS.glob(pattern)
    return found


def assert_quiet(text: str) -> None:
    assert "Task exception was never retrieved" not in text and "Traceback" not in text, text[-3000:]


# -- 1. v2 fill_value null -------------------------------------------------------------


@pytest.mark.parametrize("name", ["float_v2_fv_null", "int_v2_fv_null"])
def test_v2_fill_value_null_is_shown(name: str, mount) -> None:
    """[read-6] v2 `"fill_value": null` with a numeric dtype: `zfuse info` and the
    mount work; chunk files and the dual-access array equal zarr-python's."""
    src = COMPAT_V2 / f"{name}.zarr"
    info = zfuse("info", str(src))
    assert info.returncode == 0, info.stderr
    assert "1 chunk files" in info.stdout and "TypeError" not in info.stderr
    m = mount(src, "-o", "ro")
    assert check_shown(m.path, reference("", src, "")) == 1
    doc = json.loads((m.path / "zarr.json").read_text())
    assert doc["fill_value"] == 0  # zarr-python reads what null leaves unwritten as zeros
    assert_quiet(m.log())


# -- 2. v2 filters ---------------------------------------------------------------------

FILTERED_V2 = [
    "1d.contiguous.shuffle.i2",
    "1d.contiguous.delta.i2",
    "1d.contiguous.delta.shuffle.i2",
    "1d.contiguous.fixedscaleoffset.f4",
    "1d.contiguous.bitround.f4",
    "1d.contiguous.f4.be",  # big-endian
    "3d.chunked.mixed.i2.F",  # F order
]


def test_v2_filters_big_endian_and_f_order_are_shown(mount) -> None:
    """[read-6] v2 arrays with shuffle, delta, fixedscaleoffset and bitround filters,
    big-endian and F-order ones: shown, equal to zarr-python."""
    m = mount(ZARRITA_V2, "-o", "ro")
    for name in FILTERED_V2:
        exp = reference(name, ZARRITA_V2, name)
        assert exp.tiff, exp.error
        assert check_shown(m.path, exp) >= 1, name


def test_writing_into_a_v2_filtered_array(tmp_path: Path, mount) -> None:
    """[write-1] a chunk written through the mount is stored through the v2 filters."""
    src = tmp_path / "g.zarr"
    group = zarr.open_group(str(src), mode="w", zarr_format=2)
    import numcodecs

    arr = group.create_array("a", shape=(4, 6), chunks=(2, 3), dtype=">i2", fill_value=None,
                             filters=[numcodecs.Delta(dtype=">i2"), numcodecs.Shuffle(elementsize=2)],
                             compressors=None)
    arr[...] = np.arange(24, dtype=">i2").reshape(4, 6)
    m = mount(src)
    new = np.full((2, 3), -7, dtype="<i2")
    tifffile.imwrite(m.path / "a" / "1.1.tiff", new)
    again = zarr.open_array(str(src / "a"), mode="r")
    np.testing.assert_array_equal(again[2:4, 3:6], new)
    np.testing.assert_array_equal(again[0:2, 0:3], np.arange(24).reshape(4, 6)[0:2, 0:3])


# -- 3. v2 object arrays -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["str_v2_fv_0", "str_v2_fv_null"])
def test_v2_vlen_utf8_array_is_a_directory_that_says_why(name: str, mount) -> None:
    """[tree-5] a v2 `vlen-utf8` object array (read by zarr-python, no TIFF form):
    a directory with zarr.json and a README, as `zfuse info` says."""
    src = COMPAT_V2 / f"{name}.zarr"
    m = mount(src, "-o", "ro")
    assert sorted(os.listdir(m.path)) == ["README", "zarr.json"]
    assert "strings" in (m.path / "README").read_text()
    doc = json.loads((m.path / "zarr.json").read_text())
    assert "TIFF" in doc["attributes"]["zfuse"]["unsupported"]
    info = zfuse("info", str(src))
    assert info.returncode == 0, info.stderr
    assert "not shown as TIFF" in info.stdout and "strings" in info.stdout


# -- 4. misleading refusals -------------------------------------------------------------------

SINGLE_ARRAY_STORES = [
    ("zarrs/array_optional.zarr/array", "'optional'"),
    ("zarrs_snapshot_data/supported/regular/bfloat16/*/*/*", "'bfloat16'"),
    ("zarrs_snapshot_data/supported/regular/int4/*/*/*", "'int4'"),
    ("zarrs_snapshot_data/supported/regular/bool/a2b/packbits/*", "'packbits'"),
    ("zarrs_snapshot_data/supported/regular/bool/a2a/reshape(flatten)/*", "'reshape'"),
    ("zarrs_snapshot_data/supported/regular/float32/a2b/zfp(reversible)/*", "'zfp'"),
]


@pytest.mark.parametrize(("pattern", "cause"), SINGLE_ARRAY_STORES)
def test_single_array_store_refused_with_its_own_reason(pattern: str, cause: str) -> None:
    """A store holding one array zarr-python cannot open is refused with that array's
    reason (data type or codec), not the group attempt's ContainsArrayError."""
    (src,) = THIRDPARTY.glob(pattern)
    info = zfuse("info", str(src))
    if reference("", src, "").readable:  # a codec zfuse (or zarr) has learnt since: shown
        assert info.returncode == 0, info.stderr
        return
    assert info.returncode == 1, info.stdout
    assert "ContainsArrayError" not in info.stderr, info.stderr
    assert cause in info.stderr and str(src) in info.stderr, info.stderr
    assert ("data type" in info.stderr) or ("codec" in info.stderr), info.stderr
    assert_quiet(info.stderr)


def test_mount_of_a_refused_store_says_why(tmp_path: Path) -> None:
    """`zfuse mount` (background) prints the array's reason and mounts nothing."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = zfuse("mount", str(THIRDPARTY / "zarrs" / "array_optional.zarr" / "array"), str(mnt), "-o", "ro")
    assert r.returncode != 0 and not os.path.ismount(mnt)
    assert "data type" in r.stderr and "'optional'" in r.stderr and "ContainsArrayError" not in r.stderr


# -- 5. one bad array never takes down the hierarchy ---------------------------------------------


def test_zarrita_v2_mounts_with_its_json2_array_explained(mount) -> None:
    """[tree-5] zarrita.js's v2/data.zarr: the `json2` object array is a directory
    saying why; the 31 arrays zarr-python reads are shown (25 as TIFF, 6 strings
    with their own README)."""
    m = mount(ZARRITA_V2, "-o", "ro")
    arrays = [n for n in os.listdir(m.path) if n not in ("zarr.json", "my group with spaces")]
    assert len(arrays) == 32
    readme = (m.path / "1d.contiguous.json2.O" / "README").read_text()
    assert "'1d.contiguous.json2.O'" in readme and "json2" in readme and "'|O'" in readme
    shown = [n for n in arrays if not (m.path / n / "README").exists()]
    assert len(shown) == 25
    for name in ("1d.chunked.i2", "3d.chunked.mixed.i2.C"):
        check_shown(m.path, reference(name, ZARRITA_V2, name))
    info = zfuse("info", str(ZARRITA_V2))
    assert info.returncode == 0, info.stderr
    assert "not shown: array '1d.contiguous.json2.O'" in info.stdout
    assert_quiet(m.log())
    assert_quiet(info.stderr)


def test_zarr_python2_fixture_mounts_with_group_14_explained(mount) -> None:
    """[tree-5] zarr-python 2's fixture/: group 14 (`|S1` arrays with `fill_value` 0)
    is explained, naming the array and the field; everything else is shown; no
    unretrieved task exceptions."""
    m = mount(FIXTURE, "-o", "ro")
    for name in ("0", "14"):
        assert (m.path / name).is_dir()
    for variant in os.listdir(m.path / "14"):
        if variant == "zarr.json":
            continue
        readme = (m.path / "14" / variant / "README").read_text()
        assert f"'14/{variant}'" in readme and "fill_value 0" in readme and "'|S1'" in readme
    check_shown(m.path, reference("flat", FIXTURE, "flat"))
    assert_quiet(m.log())
    info = zfuse("info", str(FIXTURE))
    assert info.returncode == 0, info.stderr
    assert "not shown: array '14/" in info.stdout and "fill_value 0" in info.stdout
    assert_quiet(info.stderr)


def test_missing_codec_package_is_explained_in_a_hierarchy(tmp_path: Path, mount) -> None:
    """[tree-5] an array whose codec package is not installed (zfpy; numcodecs.pcodec
    in v3) sits next to readable arrays: they are shown, it says why."""
    v2, v3 = tmp_path / "v2.zarr", tmp_path / "v3.zarr"
    v2.mkdir()
    (v2 / ".zgroup").write_text('{"zarr_format": 2}')
    # copies, not symbolic links: a mount follows no link out of its store
    shutil.copytree(THIRDPARTY / "zarrs" / "v2" / "array_zfpy_C.zarr", v2 / "zfpy")
    shutil.copytree(THIRDPARTY / "zarrs" / "v2" / "array_blosc_C.zarr", v2 / "blosc")
    v3.mkdir()
    (v3 / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    shutil.copytree(THIRDPARTY / "zarrs" / "v3_zarr_python" / "array_pcodec.zarr", v3 / "pcodec")
    shutil.copytree(THIRDPARTY / "zarrs" / "v3_zarr_python" / "array_zstd.zarr", v3 / "zstd")
    for root, bad, codec, good in ((v2, "zfpy", "'zfpy'", "blosc"), (v3, "pcodec", "pcodec", "zstd")):
        m = mount(root, "-o", "ro")
        check_shown(m.path, reference(good, root, good))
        exp = reference(bad, root, bad)
        if exp.readable:  # the package is installed here after all: then it is shown
            check_shown(m.path, exp)
            continue
        readme = (m.path / bad / "README").read_text()
        assert f"'{bad}'" in readme and codec in readme and "not installed" in readme, readme
        assert_quiet(m.log())


# -- consolidated metadata ------------------------------------------------------------------


def _consolidated_v2(tmp_path: Path) -> Path:
    src = tmp_path / "c.zarr"
    group = zarr.open_group(str(src), mode="w", zarr_format=2)
    for name in ("a", "b"):
        group.create_array(name, shape=(4,), chunks=(2,), dtype="u2")[...] = np.arange(4) + ord(name)
    zarr.consolidate_metadata(str(src))
    # after consolidating: one array added, one listed array's directory removed
    zarr.open_group(str(src), mode="a", zarr_format=2, use_consolidated=False).create_array(
        "c", shape=(4,), chunks=(2,), dtype="u2")[...] = 9
    for f in (src / "b").iterdir():
        f.unlink()
    (src / "b").rmdir()
    return src


def test_consolidated_metadata_is_honoured_as_zarr_python_does(tmp_path: Path, mount) -> None:
    """Where `.zmetadata` and the store disagree, the mount shows what zarr-python
    shows (the consolidated members), reading the same values, and does not crash."""
    src = _consolidated_v2(tmp_path)
    expected = sorted(name for name, _ in zarr.open_group(str(src), mode="r").members())
    m = mount(src, "-o", "ro")
    assert sorted(n for n in os.listdir(m.path) if n != "zarr.json") == expected == ["a", "b"]
    for name in expected:
        want = zarr.open_group(str(src), mode="r")[name][...]
        np.testing.assert_array_equal(zarr.open_array(str(m.path / name), mode="r")[...], want)


def test_unusable_consolidated_metadata_is_ignored(tmp_path: Path, mount) -> None:
    """`.zmetadata` zarr-python cannot parse: the members' own metadata is used."""
    src = _consolidated_v2(tmp_path)
    (src / ".zmetadata").write_text("{not json")
    with pytest.raises(Exception):  # noqa: B017 - zarr-python itself gives up on the group
        zarr.open_group(str(src), mode="r")
    m = mount(src, "-o", "ro")
    assert sorted(n for n in os.listdir(m.path) if n != "zarr.json") == ["a", "c"]
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "c"), mode="r")[...], 9)


def test_v3_consolidated_metadata_with_a_bad_entry(tmp_path: Path, mount) -> None:
    """A subgroup whose consolidated metadata holds an array zarr-python cannot parse:
    the subgroup is read from its members' own metadata; the bad array says why."""
    src = tmp_path / "v3.zarr"
    root = zarr.open_group(str(src), mode="w")
    sub = root.create_group("sub")
    sub.create_array("good", shape=(3,), chunks=(3,), dtype="i4")[...] = [1, 2, 3]
    sub.create_array("bad", shape=(3,), chunks=(3,), dtype="i4")
    zarr.consolidate_metadata(str(src), path="sub")
    for doc_path in (src / "sub" / "zarr.json", src / "sub" / "bad" / "zarr.json"):
        doc = json.loads(doc_path.read_text())
        entry = doc["consolidated_metadata"]["metadata"]["bad"] if "consolidated_metadata" in doc else doc
        entry["data_type"] = "int4"
        doc_path.write_text(json.dumps(doc))
    m = mount(src, "-o", "ro")
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "sub" / "good"), mode="r")[...], [1, 2, 3])
    readme = (m.path / "sub" / "bad" / "README").read_text()
    assert "'sub/bad'" in readme and "'int4'" in readme
    assert_quiet(m.log())
