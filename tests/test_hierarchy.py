"""Building the view member by member, and the reasons for what is not shown (no FUSE)."""

from __future__ import annotations

import gc
import io
import json
import logging
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from zfuse.daemon import MountConfig
from zfuse.errors import MetadataError
from zfuse.open_view import make_view
from zfuse.view.array_view import ViewOptions
from zfuse.view.hierarchy import unsupported_reason
from zfuse.view.source import v3_fill_value
from zfuse.view.tree import README_NAME, build_view

import stores


def _edit(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def _group_with_bad_members(tmp_path: Path) -> Path:
    src = tmp_path / "g.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.create_array("good", shape=(4,), chunks=(2,), dtype="u1")[...] = 5
    for name in ("dtype", "codec", "fill"):
        root.create_array(name, shape=(4,), chunks=(2,), dtype="u1")
    _edit(src / "dtype" / "zarr.json", data_type="int4")
    _edit(src / "codec" / "zarr.json", codecs=[{"name": "bytes"}, {"name": "no-such-codec"}])
    _edit(src / "fill" / "zarr.json", fill_value="not a number")
    sub = root.create_group("sub")
    sub.create_array("broken", shape=(2,), chunks=(2,), dtype="u1")
    (src / "sub" / "broken" / "zarr.json").write_text("{not json")
    return src


def test_bad_members_are_listed_with_reasons_and_never_hide_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _group_with_bad_members(tmp_path)
    caplog.set_level(logging.ERROR, logger="asyncio")
    view = make_view(MountConfig([str(src)], "/nonexistent", read_only=True))
    gc.collect()  # unretrieved task exceptions are reported when the task is collected
    assert "never retrieved" not in caplog.text
    assert [path for path, _ in view.arrays()] == [("good",)]
    reasons = dict(view.problems)
    assert sorted(reasons) == ["codec", "dtype", "fill", "sub/broken"]
    assert reasons["dtype"] == "array 'dtype': data type 'int4' is not known to zarr-python"
    assert reasons["codec"] == "array 'codec': codec 'no-such-codec' is not known to zarr-python"
    assert reasons["fill"].startswith("array 'fill': fill_value 'not a number' is not a value of data type 'uint8'")
    assert reasons["sub/broken"].startswith("array 'sub/broken': ") and "not JSON" in reasons["sub/broken"]
    # each is a directory with zarr.json (its stored metadata plus the reason) and README
    for path, reason in view.problems:
        parts = tuple(path.split("/"))
        names = [name for name, _ in view.list_dir(parts)]
        assert names == [README_NAME, "zarr.json"], (path, names)
        readme = view.entry((*parts, README_NAME))
        assert readme is not None and readme.content is not None
        assert readme.content.decode().startswith(reason)
        meta = json.loads(view.entry((*parts, "zarr.json")).content)
        assert meta["attributes"]["zfuse"]["unsupported"] == reason


def test_v2_member_with_an_unknown_compressor(tmp_path: Path) -> None:
    src = tmp_path / "v2.zarr"
    v2 = zarr.open_group(str(src), mode="w", zarr_format=2)
    v2.create_array("ok", shape=(2,), chunks=(2,), dtype="f4")[...] = 1
    v2.create_array("odd", shape=(2,), chunks=(2,), dtype="f4")
    _edit(src / "odd" / ".zarray", compressor={"id": "not-a-numcodecs-codec"})
    view = make_view(MountConfig([str(src)], "/nonexistent", read_only=True))
    assert [path for path, _ in view.arrays()] == [("ok",)]
    ((path, reason),) = view.problems
    assert path == "odd" and reason.startswith("array 'odd': codec 'not-a-numcodecs-codec'"), reason


def test_a_root_array_zarr_cannot_open_is_refused_with_its_reason(tmp_path: Path) -> None:
    src = _group_with_bad_members(tmp_path) / "codec"
    # (the root is opened through zfuse.open_array, whose metadata check words it)
    with pytest.raises(MetadataError, match="unknown codec 'no-such-codec'") as info:
        make_view(MountConfig([str(src)], "/nonexistent", read_only=True))
    assert "ContainsArrayError" not in str(info.value) and str(src) in str(info.value)


def test_unsupported_reason_names_path_and_cause() -> None:
    doc = {"zarr_format": 2, "shape": [2], "dtype": "|O", "filters": [{"id": "json2"}], "fill_value": 0}
    reason = unsupported_reason("a/b", ValueError("No Zarr data type found that matches '|O'"), doc)
    assert reason == "array 'a/b': data type '|O' (Python objects encoded by 'json2') is not supported by zarr-python"
    group_doc = {"zarr_format": 3, "node_type": "group"}
    assert unsupported_reason("g", RuntimeError("boom"), group_doc) == (
        "group 'g': zarr-python cannot open it: RuntimeError: boom")
    assert unsupported_reason("x", "dates have no TIFF form", None) == "array 'x': dates have no TIFF form"


@pytest.mark.parametrize(
    ("value", "dtype", "encoded"),
    [
        (None, ">f4", 0.0),
        (np.nan, "<f8", "NaN"),
        (np.inf, ">f2", "Infinity"),
        (-np.inf, "<f4", "-Infinity"),
        (1 + 2j, ">c8", [1.0, 2.0]),
        (complex(np.nan, 0), "<c16", ["NaN", 0.0]),
        (True, "|b1", True),
        (-3, ">i2", -3),
        (2**64 - 1, "<u8", 2**64 - 1),
    ],
)
def test_fill_values_in_v3_json(value: object, dtype: str, encoded: object) -> None:
    assert v3_fill_value(value, np.dtype(dtype)) == encoded


def test_v2_metadata_zarr_cannot_convert_gives_a_view(tmp_path: Path) -> None:
    """fill_value null, numcodecs filters, big-endian, F order: the view's zarr.json
    is built by zfuse (zarr's v2 -> v3 conversion fails on these)."""
    src = tmp_path / "a.zarr"
    arr = zarr.create_array(str(src), shape=(3, 5), chunks=(2, 2), dtype=">f4", fill_value=None,
                            zarr_format=2, order="F", compressors=None,
                            filters=[numcodecs.Delta(dtype=">f4"), numcodecs.Shuffle(elementsize=4)])
    arr[...] = np.arange(15, dtype=">f4").reshape(3, 5)
    view = build_view(zarr.open_array(str(src), mode="r"), ViewOptions())
    assert not view.problems
    doc = json.loads(view.root.metadata)
    assert doc["data_type"] == "float32" and doc["fill_value"] == 0.0 and doc["shape"] == [3, 5]
    assert doc["chunk_key_encoding"]["configuration"]["base_encoding"] == {
        "name": "v2", "configuration": {"separator": "."}}


def test_ome_axes_that_do_not_fit_the_array_name_the_cause(tmp_path: Path) -> None:
    """OME-Zarr multiscales naming 2 axes for a 3-d array: that array is shown without
    chunk files, and its README says the TIFF layout's own reason (not a zarr one)."""
    src = tmp_path / "g.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.attrs["multiscales"] = [{"axes": [{"name": "y"}, {"name": "x"}], "datasets": [{"path": "0"}]}]
    root.create_array("0", shape=(4, 4, 4), chunks=(2, 2, 2), dtype="u1")
    root.create_group("sub").create_array("other", shape=(4, 4, 4), chunks=(2, 2, 2), dtype="u1")
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    assert [(p.path, p.reason) for p in view.problems] == [
        ("0", "array '0': axes must have one entry per axis (3); got ['y', 'x']")]
    assert view.entry(("0", README_NAME)) is not None
    assert view.entry(("sub", "other", "c")).node.is_dir  # the neighbour is shown as usual


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_nested_dataset_paths_carry_their_axes_and_scales(tmp_path: Path, version: str) -> None:
    """ngff-zarr's `scale0/image`: the chunk files of a dataset below a subgroup have the
    multiscale's axes (c, y, x: ImageJ channels) and its scales, as flat paths have."""
    import tifffile

    src = tmp_path / "n.zarr"
    stores.ngff_nested(src, version)
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    for level in range(2):
        arr, coords = view.chunk_at((f"scale{level}", "image", "c", "0", "0", "0.tiff"))
        assert arr is not None and coords is not None and arr.ome is not None
        assert arr.ome["axes"] == ["c", "y", "x"]
        assert arr.ome["scales"] == [1.0, 0.65 * 2**level, 0.65 * 2**level]
        with tifffile.TiffFile(io.BytesIO(arr.read(coords, 0, arr.file_size(coords)))) as tif:
            assert tif.imagej_metadata["channels"] == 2
            assert tif.series[0].axes == "CYX"
            x_resolution = tif.pages[0].tags["XResolution"].value
            assert x_resolution[1] / x_resolution[0] == pytest.approx(0.65 * 2**level)


def _lazy_view(monkeypatch: pytest.MonkeyPatch, src: Path):
    """The view of `src` built as for a remote store (groups open their members when first
    looked at), with the list of store directories its listings asked for."""
    from zfuse.view import tree
    from zfuse.view.source import StoreAccess

    monkeypatch.setattr(tree, "store_access", lambda store: StoreAccess(remote=True))
    listed: list[str] = []
    group = zarr.open_group(str(src), mode="r")
    real = type(group.store_path.store).list_dir

    def list_dir(self, prefix: str):  # type: ignore[no-untyped-def]
        listed.append(prefix)
        return real(self, prefix)

    monkeypatch.setattr(type(group.store_path.store), "list_dir", list_dir)
    return build_view(group, ViewOptions()), listed


def test_a_remote_groups_members_are_opened_when_first_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote store's view is built from the root alone: a group lists and opens its
    members the first time a path goes through it (store I/O: memory-only callers get
    NEEDS_IO), once; problems are found then, and watchers hear of them."""
    from zfuse.view.tree import NEEDS_IO

    src = _group_with_bad_members(tmp_path)
    view, listed = _lazy_view(monkeypatch, src)
    assert listed == [] and view.problems == [] and list(view.arrays()) == []
    heard: list[str] = []
    view.watch_problems(lambda problem: heard.append(problem.path))
    assert view.entry(("good",), memory_only=True) is NEEDS_IO
    assert view.needs_io((), listing=True) and view.needs_io(("good",))
    assert view.chunk_at(("good", "c", "0.tiff"), memory_only=True) == (None, None)
    assert view.entry(("zarr.json",), memory_only=True) is not NEEDS_IO  # the root's own document
    assert view.entry(("good", "c", "0.tiff")) is not None  # opens the root's members
    assert listed == [""]
    assert sorted(p.path for p in view.problems) == sorted(heard) == ["codec", "dtype", "fill"]
    assert [path for path, _ in view.arrays()] == [("good",)]
    assert not view.needs_io((), listing=True) and view.entry(("good",), memory_only=True) is not NEEDS_IO
    assert view.entry(("sub", "broken"), memory_only=True) is NEEDS_IO  # sub: not yet
    assert [name for name, _ in view.list_dir(("sub",))] == ["broken", "zarr.json"]
    assert listed == ["", "sub"] and heard[-1] == "sub/broken"
    view.open_all()  # (nothing left to open: no listing more)
    assert listed == ["", "sub"]


def test_a_remote_multiscale_opens_the_groups_its_datasets_lie_in_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ngff-zarr's `scale0/image`: opening the multiscale group opens scale0 and scale1
    too, so its pyramid.ome.tif is planned from memory."""
    src = tmp_path / "n.zarr"
    stores.ngff_nested(src, "0.5")
    view, listed = _lazy_view(monkeypatch, src)
    assert view.needs_io((), listing=True)
    names = [name for name, _ in view.list_dir(())]
    assert "pyramid.ome.tif" in names and sorted(listed) == ["", "scale0", "scale1"]
    assert not view.needs_io(("pyramid.ome.tif",)) and not view.needs_io(("scale0",), listing=True)


def test_a_remote_group_that_fails_to_open_is_opened_again_on_the_next_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group whose listing fails (a store that does not answer in time) fails that
    request with the error, stays unopened, and opens on the next one; problems found
    are listed once."""
    from zfuse.errors import StoreTimeoutError
    from zfuse.view import tree

    src = _group_with_bad_members(tmp_path)
    view, _ = _lazy_view(monkeypatch, src)
    real = tree.member_names
    calls: list[int] = []

    def flaky(group):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise StoreTimeoutError("list_dir of '/' took longer than 5 s")
        return real(group)

    monkeypatch.setattr(tree, "member_names", flaky)
    with pytest.raises(StoreTimeoutError):
        view.entry(("good",))
    assert view.needs_io((), listing=True) and view.problems == []
    assert view.entry(("good",)) is not None and len(calls) == 2
    assert sorted(p.path for p in view.problems) == ["codec", "dtype", "fill"]


def _opened_names(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names each opening of members asked for (`hierarchy.open_members`), in order."""
    from zfuse.view import tree

    real = tree.open_members
    calls: list[list[str]] = []

    def recorded(group, names):  # type: ignore[no-untyped-def]
        calls.append(list(names))
        return real(group, names)

    monkeypatch.setattr(tree, "open_members", recorded)
    return calls


@pytest.mark.parametrize("remote", [False, True])
def test_a_big_group_opens_each_member_when_it_is_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: bool
) -> None:
    """[hostile-4] a group of more than MEMBERS_OPENED_TOGETHER names (here 3) is
    listed, not opened: its directory shows the listed names; a lookup opens that one
    member (a stray name is then no longer shown; a bad member is then a problem); the
    rest stay unopened until looked up, or until `open_all` (`zfuse info`)."""

    src = _group_with_bad_members(tmp_path)  # codec, dtype, fill, good, sub
    (src / "stray").mkdir()  # a directory with nothing below it: no node
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_TOGETHER", 3)
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_AHEAD", 2)
    calls = _opened_names(monkeypatch)
    if remote:
        view, _ = _lazy_view(monkeypatch, src)
    else:
        view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    names = ["codec", "dtype", "fill", "good", "stray", "sub", "zarr.json"]
    assert [n for n, _ in view.list_dir(())] == names and calls == []
    assert not view.needs_io((), listing=True)  # listed: a readdir answers from memory
    assert view.needs_io(("good",)) and view.problems == []
    assert view.entry(("good", "c", "0.tiff")) is not None
    # with the next name listed (MEMBERS_OPENED_AHEAD), for a walker's next lookup
    assert calls == [["good", "stray"]] and not view.needs_io(("good", "zarr.json"))
    assert view.entry(("stray",)) is None and view.entry(("nothing",)) is None
    assert calls == [["good", "stray"]]  # (a name not listed costs nothing)
    assert [n for n, _ in view.list_dir(())] == ["codec", "dtype", "fill", "good", "sub", "zarr.json"]
    assert view.entry(("codec",)) is not None and calls[-1] == ["codec", "dtype"]
    assert [p.path for p in view.problems] == ["codec", "dtype"]
    assert [path for path, _ in view.arrays()] == [("good",)]
    view.open_all()  # then as the view of a group opened whole
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_TOGETHER", 1000)
    whole = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    whole.open_all()
    assert view.problems == whole.problems and len(whole.problems) == 4
    assert sorted(p for p, _ in view.arrays()) == sorted(p for p, _ in whole.arrays())
    assert view.list_dir(("sub",)) == whole.list_dir(("sub",))


def test_a_group_of_at_most_the_bound_opens_its_members_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[hostile-4] up to MEMBERS_OPENED_TOGETHER names, a group opens all its members in
    one go when listed (side by side), and shows only those that are nodes."""

    src = _group_with_bad_members(tmp_path)
    (src / "stray").mkdir()
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_TOGETHER", 6)
    calls = _opened_names(monkeypatch)
    view, _ = _lazy_view(monkeypatch, src)
    assert [n for n, _ in view.list_dir(())] == ["codec", "dtype", "fill", "good", "sub", "zarr.json"]
    assert calls == [["codec", "dtype", "fill", "good", "stray", "sub"]]


def _nested_store(tmp_path: Path, groups: int, arrays: int) -> Path:
    """`groups` groups of `arrays` arrays each; array gGG/aA's values are 10*G + A + 1."""
    src = tmp_path / "n.zarr"
    root = zarr.open_group(str(src), mode="w")
    for g in range(groups):
        sub = root.create_group(f"g{g:02d}")
        for a in range(arrays):
            sub.create_array(f"a{a}", shape=(2,), chunks=(2,), dtype="u1")[...] = 10 * g + a + 1
    return src


def _held(node) -> int:  # type: ignore[no-untyped-def]
    """Members held opened below `node`, all the way down."""
    return sum(1 + _held(child) for child in node.opened_children().values())


@pytest.mark.parametrize("remote", [False, True])
def test_a_view_holds_a_bounded_number_of_members_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: bool
) -> None:
    """[hostile-5] however many members a walk looks up (`find` over a crafted store of
    a million), the view holds at most `members_kept` opened, plus one group's worth:
    the groups used least lately forget theirs; a member looked up again is opened
    again and reads the same; what is on the walker's path is never forgotten."""
    from zfuse.stats import Stats

    src = _nested_store(tmp_path, 12, 5)
    calls = _opened_names(monkeypatch)
    stats = Stats()
    options = ViewOptions(members_kept=12)
    if remote:
        monkeypatch.setattr("zfuse.view.tree.store_access", lambda store: __import__(
            "zfuse.view.source", fromlist=["StoreAccess"]).StoreAccess(remote=True))
    view = build_view(zarr.open_group(str(src), mode="r"), options, stats)
    if not remote:  # a local store opens members at mount only while the bound has room
        assert _held(view.root) <= 12 + 5
    most = 0
    for _ in range(2):  # the second walk finds the first's members forgotten
        for g in range(12):
            for a in range(5):
                assert view.entry((f"g{g:02d}", f"a{a}", "zarr.json")) is not None
                entry = view.entry((f"g{g:02d}", f"a{a}", "c", "0.tiff"))
                assert entry is not None and entry.array is not None
                assert bytes(entry.array.pixel_bytes((0,))) == bytes([10 * g + a + 1]) * 2
                most = max(most, _held(view.root))
    assert most <= 12 + 5 + 1  # (the bound, one group's members, and that group itself)
    assert stats.snapshot()["group_members_forgotten"] > 0
    assert sum(len(c) for c in calls) > 12 * 6  # members were opened again


def test_walkers_in_many_threads_with_a_tiny_bound_never_wait_on_each_other(tmp_path: Path) -> None:
    """[hostile-5] eight threads walk a local store of nested groups (6 x 4 groups of 3
    arrays) in different orders with `members_kept` 8: groups are forgotten and listed
    again all the time, each listing opening its groups' members while another thread
    forgets them (a forgetting never waits for a group's lock: a listing thread may hold
    the locks in the other order); every walk ends, and every lookup finds its array
    with its data."""
    import random
    import threading

    src = tmp_path / "n.zarr"
    root = zarr.open_group(str(src), mode="w")
    paths = []
    for g in range(6):
        for h in range(4):
            sub = root.require_group(f"g{g}").require_group(f"h{h}")
            for a in range(3):
                sub.create_array(f"a{a}", shape=(2,), chunks=(2,), dtype="u1")[...] = 1 + g * 12 + h * 3 + a
                paths.append((f"g{g}", f"h{h}", f"a{a}"))
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions(members_kept=8))
    failures: list[str] = []

    def walk(seed: int) -> None:
        order = paths * 3
        random.Random(seed).shuffle(order)
        for path in order:
            if view.entry((*path, "zarr.json")) is None:  # (through the groups every time)
                failures.append("/".join(path))
            entry = view.entry((*path, "c", "0.tiff"))
            g, h, a = (int(p[1:]) for p in path)
            if entry is None or bytes(entry.array.pixel_bytes((0,))) != bytes([1 + g * 12 + h * 3 + a]) * 2:
                failures.append("/".join(path))

    threads = [threading.Thread(target=walk, args=(seed,), daemon=True) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a walker never finished (waiting on a lock?)"
    assert failures == []


def test_a_big_group_past_the_bound_keeps_its_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[hostile-5] a big group (30 members) below a group holding more than the bound on
    its own (9 members, `members_kept` 4, never forgotten while a lookup goes through
    it): the big group forgets its oldest members, never its listing nor the batch the
    lookup just opened, so it is listed once (before: once per lookup, and with a
    multiscale, again and again without end)."""
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_TOGETHER", 10)
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_AHEAD", 2)
    src = tmp_path / "big.zarr"
    root = zarr.open_group(str(src), mode="w")
    for i in range(8):
        root.create_array(f"r{i}", shape=(2,), chunks=(2,), dtype="u1")
    big = root.create_group("big")
    for i in range(30):
        big.create_array(f"a{i:02d}", shape=(2,), chunks=(2,), dtype="u1")[...] = i + 1
    axes = [{"name": "x", "type": "space"}]
    big.attrs["multiscales"] = [{"version": "0.4", "axes": axes, "datasets": [
        {"path": f"a{i:02d}", "coordinateTransformations": [{"type": "scale", "scale": [2.0**i]}]} for i in range(3)]}]
    view, listed = _lazy_view(monkeypatch, src)
    view._kept.limit = 4  # (as `-o members_kept=4` makes it)
    import threading

    shapes: list[object] = []
    walk = threading.Thread(target=lambda: shapes.extend(
        json.loads(view.entry(("big", f"a{i:02d}", "zarr.json")).content)["shape"] for i in range(30)), daemon=True)
    walk.start()
    walk.join(timeout=60)
    assert not walk.is_alive(), f"the walk never ended: big listed {listed.count('big')} times"
    assert shapes == [[2]] * 30 and listed.count("big") == 1


def test_live_arrays_keep_the_first_view_made_for_a_path() -> None:
    """[hostile-5] two lookups opening one member side by side each make a view; the one
    added first is the path's, and the second gets it back (one set of caches)."""
    from zfuse.view.members import LiveArrays

    class View:  # (any object weak references reach: what LiveArrays keeps track of)
        pass

    alive, first, second = LiveArrays(), View(), View()
    assert alive.add(("a",), first) is first and alive.add(("a",), second) is first  # type: ignore[arg-type]
    assert alive.get(("a",)) is first
    del first
    gc.collect()
    assert alive.get(("a",)) is None and alive.add(("a",), second) is second  # type: ignore[arg-type]


def test_whole_images_to_plan_again_are_never_planned_from_an_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[hostile-5] a directory whose whole-image files were forgotten (past IMAGE_DIRS_KEPT)
    while the groups its pyramid lies in were forgotten too is planned again by a worker
    thread: memory-only callers (the event loop) get NEEDS_IO for its image files and
    its listing, and no store request is made for them. With those groups in memory,
    the plan is made from memory, on the loop."""
    from zfuse.view import tree
    from zfuse.view.tree import NEEDS_IO

    src = tmp_path / "n.zarr"
    stores.ngff_nested(src, "0.5")
    view, listed = _lazy_view(monkeypatch, src)
    assert "pyramid.ome.tif" in [n for n, _ in view.list_dir(())]
    monkeypatch.setattr(tree, "IMAGE_DIRS_KEPT", 1)
    view.list_dir(("scale0",))  # (the root's plan is forgotten)
    assert not view.needs_io((), listing=True)  # (scale0 and scale1 are in memory)
    view.list_dir(("scale0",))  # (forgotten again)
    view.root.member_in_memory("scale0").forget_members()  # (as past members_kept)
    before = list(listed)
    assert view.entry(("pyramid.ome.tif",), memory_only=True) is NEEDS_IO and view.needs_io((), listing=True)
    assert listed == before
    assert view.entry(("pyramid.ome.tif",)) is not None  # (planned again, in a worker)


def test_an_array_forgotten_while_in_use_is_found_again_not_made_anew(tmp_path: Path) -> None:
    """[hostile-5] a group forgets an array its walker moved past, but an open file still
    holds that array's view: looked up again it is that same view (one set of caches,
    so what a write through the open file changes, reads through the path see), and
    `arrays()` (what SIGHUP refreshes) still has it; a view nothing holds is made anew."""
    src = _nested_store(tmp_path, 6, 5)
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions(members_kept=6))
    held = view.array_at(("g00", "a1"))[0]
    unheld_ident = view.array_at(("g00", "a2"))[0].ident
    for g in range(1, 6):  # walk on: g00's members are forgotten
        for a in range(5):
            assert view.entry((f"g{g:02d}", f"a{a}", "c", "0.tiff")) is not None
    assert "g00" not in [name for name, node in view.root.opened_children().items()
                         if node.opened_children()]
    assert view.array_at(("g00", "a1"))[0] is held
    assert ("g00", "a1") in dict(view.arrays())
    gc.collect()
    assert view.array_at(("g00", "a2"))[0].ident != unheld_ident


def test_a_big_group_walked_whole_keeps_only_its_latest_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[hostile-5] one group of more members than the bound (looked up one by one, as a
    walker does): it forgets its oldest opened members, in batches, and keeps the rest."""
    from zfuse.stats import Stats

    src = tmp_path / "big.zarr"
    root = zarr.open_group(str(src), mode="w")
    for i in range(60):
        root.create_array(f"a{i:02d}", shape=(2,), chunks=(2,), dtype="u1")[...] = i + 1
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_TOGETHER", 10)
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_AHEAD", 4)
    stats = Stats()
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions(members_kept=20), stats)
    most = 0
    for i in range(60):
        entry = view.entry((f"a{i:02d}", "c", "0.tiff"))
        assert entry is not None and bytes(entry.array.pixel_bytes((0,))) == bytes([i + 1]) * 2
        most = max(most, len(view.root.opened_children()))
    assert most <= 20 + 4 and stats.snapshot()["group_members_forgotten"] >= 30
    assert len([n for n, _ in view.list_dir(())]) == 61  # (and zarr.json): all still listed


def test_whole_images_stay_planned_for_a_bounded_number_of_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[hostile-5] the whole-image files of at most IMAGE_DIRS_KEPT directories stay
    planned (a walker looks at every directory); the others are planned again, the
    same, when next looked at."""
    from zfuse.view import tree

    monkeypatch.setattr(tree, "IMAGE_DIRS_KEPT", 2)
    src = _nested_store(tmp_path, 1, 5)
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    first = {a: view.entry(("g00", f"a{a}", "image.ome.tif")).size for a in range(5)}
    assert len(view._images) == 2  # (the two looked at last)
    again = {a: view.entry(("g00", f"a{a}", "image.ome.tif")).size for a in range(5)}
    assert again == first and len(view._images) == 2


@pytest.mark.parametrize("remote", [False, True])
def test_a_hierarchy_deeper_than_the_bound_is_shown_to_it_and_no_deeper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: bool
) -> None:
    """[hostile-6] 300 nested directories with no metadata, and 70 nested groups with an
    array at the bottom (before: RecursionError, and the mount failed): the view is
    built; what lies DEPTH_MAX levels down is shown, the next level is a node shown
    without members, with a README saying why; the rest of the store is as it was."""
    from zfuse.view.tree import DEPTH_MAX

    src = tmp_path / "deep.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.create_array("good", shape=(2,), chunks=(2,), dtype="u1")[...] = 5
    stray = src / "/".join(["d"] * 300)
    stray.mkdir(parents=True)
    (stray / "x").write_bytes(b"stray")
    group = root
    for _ in range(70):
        group = group.create_group("g")
    group.create_array("a", shape=(2,), chunks=(2,), dtype="u1")[...] = 7
    if remote:
        view, _ = _lazy_view(monkeypatch, src)
    else:
        view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    assert view.entry(("good", "c", "0.tiff")) is not None
    shown = ("g",) * DEPTH_MAX
    assert view.entry(shown).node.value == "group" and view.entry((*shown, README_NAME)) is None
    too_deep = (*shown, "g")
    readme = view.entry((*too_deep, README_NAME))
    assert readme is not None and f"more than {DEPTH_MAX} levels" in readme.content.decode()
    assert view.entry((*too_deep, "g")) is None
    assert f"group '{'/'.join(too_deep)}'" in dict(view.problems)["/".join(too_deep)]
    assert view.entry(("d",) * DEPTH_MAX) is not None and view.entry(("d",) * (DEPTH_MAX + 2)) is None


def test_a_multiscale_of_ten_thousand_datasets_opens_the_first_64_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[hostile-7] a group's multiscale naming 10,000 datasets (a crafted zarr.json;
    before: each dataset's group opened one after another with the listing, a request
    each, under the group's lock): the first MULTISCALE_LEVELS_MAX are taken, and a big
    group opens them in one batch, side by side; the rest of the group is as it was."""
    from zfuse.view.ome_zarr import MULTISCALE_LEVELS_MAX

    src = tmp_path / "ms.zarr"
    root = zarr.open_group(str(src), mode="w")
    for level, size in enumerate((64, 32)):
        root.create_array(str(level), shape=(size, size), chunks=(32, 32), dtype="u1")[...] = 1
    for i in range(5):
        root.create_group(f"m{i}")
    datasets = [{"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": [2.0**level] * 2}]}
                for level in range(2)]
    datasets += [{"path": f"x{i}/y", "coordinateTransformations": [{"type": "scale", "scale": [8.0, 8.0]}]}
                 for i in range(10_000)]
    axes = [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    _edit(src / "zarr.json", attributes={"multiscales": [{"version": "0.4", "axes": axes, "datasets": datasets}]})
    monkeypatch.setattr("zfuse.view.members.MEMBERS_OPENED_TOGETHER", 3)
    calls = _opened_names(monkeypatch)
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    assert len(calls) == 1 and len(calls[0]) == MULTISCALE_LEVELS_MAX
    assert calls[0][:3] == ["0", "1", "x0"]
    assert view.entry(("pyramid.ome.tif",)) is None  # (levels missing: `zfuse info` says which)
    assert view.images_not_shown == {"/": f"no pyramid.ome.tif: multiscale dataset 'x0/y' is not an array "
                                          f"with chunk files and pixels here (and {MULTISCALE_LEVELS_MAX - 3} more)"}
    assert view.entry(("0", "image.ome.tif")) is not None and view.entry(("0", "c", "0", "0.tiff")) is not None


def test_an_array_of_more_chunk_parts_than_zfuse_reads_is_not_shown(tmp_path: Path) -> None:
    """[hostile-8] a concat-parts array whose chunks are 5,000 parts each (a crafted
    zarr.json: a chunk read would cost 5,000 requests) is a directory with a README
    saying why; the rest of the group is shown."""
    import zfuse

    src = tmp_path / "p.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.create_array("good", shape=(4,), chunks=(2,), dtype="u1")[...] = 5
    zfuse.open_array(str(src / "parts"), mode="w", shape=(4,), chunks=(4,), dtype="u1",
                     codecs=[{"name": "bytes"}],
                     storage_transformers=[{"name": "concat-parts", "configuration": {"parts": [{"key_suffix": ""}]}}])
    doc = json.loads((src / "parts" / "zarr.json").read_text())
    doc["storage_transformers"][0]["configuration"]["parts"] = [{"key_suffix": f".{i}", "size": 1} for i in range(5000)]
    (src / "parts" / "zarr.json").write_text(json.dumps(doc))
    view = make_view(MountConfig([str(src)], "/nonexistent", read_only=True))
    readme = view.entry(("parts", README_NAME))
    assert readme is not None and "5000 parts, more than zfuse reads (1024" in readme.content.decode()
    assert view.entry(("good", "c", "0.tiff")) is not None


def test_problems_kept_are_bounded_and_the_rest_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[hostile-5] a store of many broken members: the first PROBLEMS_KEPT are listed
    (`.zfuse/errors`, `zfuse info`) and logged; the rest are counted in stats only."""
    from zfuse.stats import Stats
    from zfuse.view import tree

    src = tmp_path / "broken.zarr"
    root = zarr.open_group(str(src), mode="w")
    for i in range(8):
        root.create_array(f"b{i}", shape=(2,), chunks=(2,), dtype="u1")
        _edit(src / f"b{i}" / "zarr.json", data_type="int4")
    monkeypatch.setattr(tree, "PROBLEMS_KEPT", 5)
    stats = Stats()
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions(), stats)
    assert [p.path for p in view.problems] == [f"b{i}" for i in range(5)]
    assert stats.snapshot()["problems_not_listed"] == 3
    assert view.entry(("b7", README_NAME)) is not None  # still shown, with its reason


def test_member_names_no_directory_entry_can_have_are_not_shown(caplog: pytest.LogCaptureFixture) -> None:
    """[outside-1] an object store's listing of a group may name `..`, `.`, an empty name,
    one with a backslash (keys `g/../x`, `g//x`), one longer than 255 bytes (which the
    kernel refuses in a listing: EIO for the whole directory) or a lone surrogate (no
    bytes can name it; a JSON listing may hold one): no such member is shown,
    opened or read through; the rest of the group is, and the log says how many were
    left out."""
    from zarr.storage import MemoryStore, WrapperStore

    class Crafted(WrapperStore[MemoryStore]):
        async def list_dir(self, prefix: str):  # type: ignore[override]
            async for name in self._store.list_dir(prefix):
                yield name
            if prefix == "":
                for name in ("..", ".", "", "a\\\\..\\\\b", "n" * 256, "x\ud800"):
                    yield name

    store = Crafted(MemoryStore())
    root = zarr.open_group(store, mode="w")
    root.create_array("good", shape=(4,), chunks=(2,), dtype="u1")[...] = 5
    view = build_view(zarr.open_group(store, mode="r"), ViewOptions())
    assert [n for n, _ in view.list_dir(())] == ["good", "zarr.json"]
    assert view.entry(("..",)) is None and view.problems == []
    assert "6 member name(s) that are no file name not shown" in caplog.text


def test_a_group_listing_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """[hostile-4] a group's listing keeps at most MEMBER_NAMES_MAX names (here 3): the
    first ones are shown, and the log says so."""
    from zfuse.view import hierarchy

    monkeypatch.setattr(hierarchy, "MEMBER_NAMES_MAX", 3)
    src = tmp_path / "g.zarr"
    root = zarr.open_group(str(src), mode="w")
    for name in "abcde":
        root.create_array(name, shape=(2,), chunks=(2,), dtype="u1")
    view = build_view(zarr.open_group(str(src), mode="r"), ViewOptions())
    shown = [n for n, _ in view.list_dir(()) if n != "zarr.json"]
    # (zarr.json may be one of the 3 names listed: the listing's order is the store's)
    assert 2 <= len(shown) <= 3 and set(shown) <= set("abcde") and "lists more than 3 names" in caplog.text


def test_members_added_after_consolidation_are_named(tmp_path, caplog) -> None:
    """[tree-5] an array added to a local group after its consolidated metadata was
    written: not shown (zarr-python does not see it either), but one warning names it
    and says how to show it (it was missing without a word)."""
    import logging

    import zarr

    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view

    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=2)
    g.create_array("a", shape=(8, 8), chunks=(8, 8), dtype="u1")
    zarr.consolidate_metadata(str(tmp_path / "s.zarr"))
    later = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+", use_consolidated=False)
    later.create_array("added_later", shape=(8, 8), chunks=(8, 8), dtype="u1")[...] = 1
    with caplog.at_level(logging.WARNING):
        view = make_view(MountConfig([str(tmp_path / "s.zarr")], "/unused", read_only=True))
        names = [name for name, _ in view.list_dir(())]
    assert "a" in names and "added_later" not in names
    assert "1 member(s) not in its consolidated metadata" in caplog.text and "'added_later'" in caplog.text
