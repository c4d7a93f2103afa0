"""SEMANTICS.md is checked: every claim's tag is exercised by a real-mount test.

Tests name the tags they check in their docstrings (``[read-3]``); this file
also holds the tests for claims no other file covers.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import stores

ROOT = Path(__file__).resolve().parent.parent
TAG = re.compile(r"\[((?:tree|read|write|ns|cons|image|hostile|outside|remote)-\d+)\]")


def test_every_claim_is_tested() -> None:
    claims = set(TAG.findall((ROOT / "SEMANTICS.md").read_text()))
    assert len(claims) > 30
    tested: set[str] = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        if path.name == "test_semantics.py":
            # this file's own tests count, but not the pattern or this docstring
            text = path.read_text().split("def test_every_claim_is_tested", 1)[1]
        else:
            text = path.read_text()
        tested |= set(TAG.findall(text))
    missing = sorted(claims - tested, key=lambda t: (t.split("-")[0], int(t.split("-")[1])))
    assert not missing, f"SEMANTICS.md claims with no test naming them: {missing}"
    unknown = sorted(tested - claims)
    assert not unknown, f"tests name tags SEMANTICS.md does not have: {unknown}"


@pytest.mark.mount
def test_empty_key_directories_exist(tmp_path: Path, mount) -> None:
    """[tree-4] after removing every chunk of a row, a chunk can be created in it."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    row = m.path / "c" / "0"
    for f in list(row.iterdir()):
        f.unlink()
    assert row.is_dir() and os.listdir(row) == []
    assert (m.path / "c" / "2").is_dir()  # never had to exist
    assert not (m.path / "c" / "7").exists()  # outside the grid
    values = stores.values((8, 16), "uint16", seed=4)
    tifffile.imwrite(row / "1.tiff", values)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 16:30], values[:, :14])


@pytest.mark.mount
def test_unlink_in_a_shard(tmp_path: Path, mount) -> None:
    """[ns-4] unlink empties the chunk's index entry; the last one removes the shard."""
    src = tmp_path / "s.zarr"
    data = stores.sharded(src, shape=(16, 32), shards=(16, 32), chunks=(8, 16))
    m = mount(src)
    (m.path / "c" / "0" / "1.tiff").unlink()
    m.settle()  # the store follows rm when the replace window closes
    arr = stores.open_any(src)
    np.testing.assert_array_equal(arr[0:8, 16:32], 0)
    np.testing.assert_array_equal(arr[0:8, 0:16], data[0:8, 0:16])
    assert (src / "c" / "0" / "0").exists()
    for name in ("c/0/0.tiff", "c/1/0.tiff", "c/1/1.tiff"):
        (m.path / name).unlink()
    m.settle()
    assert not (src / "c" / "0" / "0").exists()
    assert not list((m.path / "c").rglob("*.tiff"))


@pytest.mark.mount
def test_operations_that_make_no_sense_fail_clearly(tmp_path: Path, mount) -> None:
    """[ns-7] mkdir outside key directories, links, device nodes and rmdir of arrays fail."""
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    root.create_array("a", shape=(4, 4), chunks=(2, 2), dtype="uint8")[...] = 1
    m = mount(tmp_path / "g.zarr")
    for attempt, code in [
        (lambda: os.mkdir(m.path / "newarray"), errno.EPERM),
        (lambda: os.symlink("a", m.path / "link"), errno.EPERM),
        (lambda: os.link(m.path / "a" / "c" / "0" / "0.tiff", m.path / "a" / "c" / "0" / "x"), errno.EPERM),
        (lambda: os.mknod(m.path / "a" / "node"), errno.EPERM),
        (lambda: os.rmdir(m.path / "a"), errno.ENOTEMPTY),
        (lambda: os.mkdir(m.path / "a" / "c" / "1"), errno.EEXIST),
    ]:
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == code, (e.value, code)
    with pytest.raises(OSError) as e:
        (m.path / "a" / "zarr.json").write_text("{}")
    assert e.value.errno == errno.EACCES


@pytest.mark.mount
def test_sighup_shows_changes_made_by_others(tmp_path: Path, mount) -> None:
    """[cons-2] a chunk added to the store behind the mount's back appears after SIGHUP."""
    src = tmp_path / "a.zarr"
    a = zarr.create_array(str(src), shape=(16, 16), chunks=(8, 8), dtype="uint8", fill_value=0)
    a[0:8, 0:8] = 1
    m = mount(src)
    assert not (m.path / "c" / "1" / "1.tiff").exists()
    assert tifffile.imread(m.path / "c" / "0" / "0.tiff").max() == 1
    a[8:16, 8:16] = 2
    a[0:8, 0:8] = 3
    m.proc.send_signal(signal.SIGHUP)
    for _ in range(200):
        if (m.path / "c" / "1" / "1.tiff").exists():
            break
        import time

        time.sleep(0.05)
    assert tifffile.imread(m.path / "c" / "1" / "1.tiff").max() == 2
    assert tifffile.imread(m.path / "c" / "0" / "0.tiff").max() == 3


@pytest.mark.mount
def test_sigterm_commits_dirty_open_files(tmp_path: Path, mount) -> None:
    """[cons-3] a file still open for writing when the daemon is stopped is committed if it parses."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    values = stores.values((8, 16), "uint16", seed=77)
    tifffile.imwrite(tmp_path / "n.tif", values)
    f = open(m.path / "c" / "1" / "0.tiff", "wb")  # noqa: SIM115 - kept open across the stop
    f.write((tmp_path / "n.tif").read_bytes())
    f.flush()
    m.proc.send_signal(signal.SIGTERM)
    try:
        f.close()
    except OSError:
        pass
    m.proc.wait(timeout=30)
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], values)
    stats_tag = json.dumps({"ok": True})  # the stats file is JSON; see [tree-6]
    assert stats_tag


@pytest.mark.mount
def test_sighup_reloads_metadata(tmp_path: Path, mount) -> None:
    """[cons-2] arrays added or resized behind the mount's back appear after SIGHUP."""
    import time

    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    a = root.create_array("a", shape=(8, 8), chunks=(8, 8), dtype="uint8", fill_value=0)
    a[...] = 1
    m = mount(tmp_path / "g.zarr")
    assert sorted(os.listdir(m.path)) == ["a", "zarr.json"]
    root.create_array("b", shape=(4, 4), chunks=(4, 4), dtype="uint8", fill_value=0)[...] = 2
    a.resize((16, 8))
    a[8:16] = 3
    m.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "b" not in os.listdir(m.path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tifffile.imread(m.path / "b" / "c" / "0" / "0.tiff").max() == 2
    assert tifffile.imread(m.path / "a" / "c" / "1" / "0.tiff").max() == 3
    assert json.loads((m.path / "a" / "zarr.json").read_text())["shape"] == [16, 8]


@pytest.mark.mount
def test_created_empty_file_is_a_placeholder(tmp_path: Path, mount) -> None:
    """[ns-9] touch of a new chunk name succeeds; nothing is stored until a TIFF is written."""
    src = tmp_path / "a.zarr"
    a = zarr.create_array(str(src), shape=(16, 16), chunks=(8, 8), dtype="uint8", fill_value=0)
    a[0:8, 0:8] = 1
    m = mount(src)
    target = m.path / "c" / "1" / "1.tiff"
    subprocess_touch = subprocess.run(["touch", str(target)], capture_output=True, text=True)
    assert subprocess_touch.returncode == 0, subprocess_touch.stderr
    assert target.exists() and target.stat().st_size == 0
    assert not (src / "c" / "1" / "1").exists()
    values = np.full((8, 8), 9, "uint8")
    tifffile.imwrite(tmp_path / "v.tif", values)
    with open(target, "r+b") as f:  # fill it later, without O_TRUNC
        f.write((tmp_path / "v.tif").read_bytes())
    np.testing.assert_array_equal(zarr.open_array(str(src))[8:16, 8:16], values)
    # emptying a stored chunk (open with O_TRUNC, close) is an incomplete replacement:
    # no error, nothing stored, the chunk unchanged
    open(m.path / "c" / "0" / "0.tiff", "wb").close()
    assert zarr.open_array(str(src))[0, 0] == 1
    m.unmount()
    assert zarr.open_array(str(src))[0, 0] == 1
