"""Virtual concatenation (zfuse.concat): reads equal numpy.concatenate, writes
land in the right source and nowhere else, mismatches are refused, and the
description file round-trips.  Real zarr arrays on LocalStore, no mocks."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import basic_indices

from zfuse.errors import MetadataError, ReadOnlyArrayError, SourceMismatchError
from zfuse.ext.concat import (
    ConcatArray,
    concat,
    describe,
    is_concat_description,
    load_concat,
    save_concat,
)

HYP = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def make_source(
    path: Path, data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...] | None = None
) -> zarr.Array:
    arr = zarr.create_array(
        store=zarr.storage.LocalStore(path),
        shape=data.shape,
        chunks=chunks,
        shards=shards,
        dtype=data.dtype,
        fill_value=0,
    )
    arr[...] = data
    return arr


def source_data(ca: ConcatArray) -> list[np.ndarray]:
    return [np.asarray(s[...]) for s in ca.sources]


def split_model(model: np.ndarray, ca: ConcatArray) -> list[np.ndarray]:
    return np.split(model, ca.offsets[1:], axis=ca.axis)


def padded_chunk(model: np.ndarray, ca: ConcatArray, coords: tuple[int, ...]) -> np.ndarray:
    out = np.full(ca.chunks, ca.fill_value, dtype=model.dtype)
    region = tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, ca.chunks, strict=True))
    part = model[region]
    out[tuple(slice(0, n) for n in part.shape)] = part
    return out


# --------------------------------------------------------------- tsconcat example
@pytest.fixture
def tsconcat_sources(tmp_path: Path) -> tuple[zarr.Array, zarr.Array, np.ndarray, np.ndarray]:
    d1 = np.arange(8, dtype="u2").reshape(2, 2, 2) + 1
    d2 = np.arange(12, dtype="u2").reshape(2, 3, 2) + 100
    a1 = make_source(tmp_path / "ds1.zarr", d1, (1, 2, 1))
    a2 = make_source(tmp_path / "ds2.zarr", d2, (1, 2, 1))
    return a1, a2, d1, d2


ALL_SLICE_PARTS = [None, -6, -3, -1, 0, 1, 2, 3, 5, 6]
ALL_STEPS = [None, 1, 2, 3, -1, -2, -3]


@pytest.mark.parametrize("order", ["12", "21"])
def test_tsconcat_example_reads(tsconcat_sources, order: str) -> None:
    a1, a2, d1, d2 = tsconcat_sources
    srcs, datas = ([a1, a2], [d1, d2]) if order == "12" else ([a2, a1], [d2, d1])
    ca = concat(srcs, 1)
    model = np.concatenate(datas, axis=1)
    assert ca.shape == (2, 5, 2) and ca.dtype == model.dtype and ca.chunks == (1, 2, 1)
    assert ca.offsets == ((0, 2) if order == "12" else (0, 3))
    np.testing.assert_array_equal(ca[...], model)
    np.testing.assert_array_equal(np.asarray(ca), model)
    # every slice of every dimension (others full), and every integer index
    for dim in range(3):
        for start, stop, step in itertools.product(ALL_SLICE_PARTS, ALL_SLICE_PARTS, ALL_STEPS):
            key = tuple(slice(start, stop, step) if d == dim else slice(None) for d in range(3))
            got, want = ca[key], model[key]
            assert got.shape == want.shape, key
            np.testing.assert_array_equal(got, want, err_msg=str(key))
    for idx in itertools.product(range(-2, 2), range(-5, 5), range(-2, 2)):
        assert ca[idx] == model[idx]
    # mixed keys: ints, Ellipsis, newaxis
    for key in [
        (1, ...),
        (..., 1),
        (..., 3, slice(None)),
        (None, 0, slice(None, None, -1)),
        (slice(1, None), 4, None, 1),
    ]:
        np.testing.assert_array_equal(ca[key], model[key])
        assert ca[key].shape == model[key].shape
    # every block and every block slice
    grid = ca.cdata_shape
    assert grid == (2, 3, 2)
    for bidx in itertools.product(*(range(g) for g in grid)):
        region = tuple(slice(b * c, (b + 1) * c) for b, c in zip(bidx, ca.chunks, strict=True))
        np.testing.assert_array_equal(ca.blocks[bidx], model[region])
        np.testing.assert_array_equal(ca.read_chunk(bidx), padded_chunk(model, ca, bidx))
    for lo, hi in itertools.combinations(range(4), 2):
        np.testing.assert_array_equal(ca.blocks[:, lo:hi], model[:, lo * 2 : hi * 2])
    np.testing.assert_array_equal(ca.blocks[-1, -1, -1], model[1:, 4:, 1:])
    # 12 is chunk-aligned (boundary at 2); 21 has its boundary at 3, inside chunk 1
    straddling = list(ca.straddling_chunks())
    if order == "12":
        assert straddling == []
    else:
        assert straddling == [(0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]
        assert [i for i, _, _ in ca.chunk_sources((0, 1, 0))] == [0, 1]
    info = describe(ca)
    assert [s["offset"] for s in info["sources"]] == list(ca.offsets)
    assert info["straddling_total"] == len(straddling)


@pytest.mark.parametrize("order", ["12", "21"])
def test_tsconcat_example_writes(tsconcat_sources, order: str) -> None:
    a1, a2, d1, d2 = tsconcat_sources
    srcs, datas = ([a1, a2], [d1, d2]) if order == "12" else ([a2, a1], [d2, d1])
    ca = concat(srcs, 1)
    model = np.concatenate(datas, axis=1)
    ca[:, 1:4] = 7
    model[:, 1:4] = 7
    ca[0, ::-2, 1] = [50, 51, 52]
    model[0, ::-2, 1] = [50, 51, 52]
    ca.write_chunk((1, 1, 0), np.array([[[60], [61]]], dtype="u2"))
    model[1:2, 2:4, 0:1] = [[[60], [61]]]
    ca.blocks[1, 2, 1] = 99
    model[1, 4, 1] = 99
    for got, want in zip(source_data(ca), split_model(model, ca), strict=True):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------ property tests
@st.composite
def concat_setups(draw: st.DrawFn, max_sources: int = 5) -> dict:
    rank = draw(st.integers(1, 4))
    axis = draw(st.integers(-rank, rank - 1))
    nsrc = draw(st.integers(2, max_sources))
    max_other = 4 if rank <= 2 else 3
    other = [draw(st.integers(1, max_other)) for _ in range(rank)]
    lengths = [draw(st.integers(1, 5)) for _ in range(nsrc)]
    dtype = draw(st.sampled_from(["i4", "u2", "f8"]))
    shapes, chunks, shards = [], [], []
    for n in lengths:
        shape = tuple(n if d == axis % rank else other[d] for d in range(rank))
        shapes.append(shape)
        # chunk shapes differ per source, may exceed the extent
        chunk = tuple(draw(st.integers(1, s + 1)) for s in shape)
        chunks.append(chunk)
        # some sources sharded (inner chunks = the chunk shape above)
        shards.append(
            tuple(c * draw(st.integers(1, 2)) for c in chunk) if draw(st.booleans()) else None
        )
    return {"axis": axis, "shapes": shapes, "chunks": chunks, "shards": shards, "dtype": dtype}


def build(root: Path, setup: dict) -> tuple[ConcatArray, np.ndarray]:
    base = root / uuid.uuid4().hex
    datas, arrays = [], []
    start = 1
    layout = zip(setup["shapes"], setup["chunks"], setup["shards"], strict=True)
    for i, (shape, chunks, shards) in enumerate(layout):
        n = int(np.prod(shape))
        data = np.arange(start, start + n).reshape(shape).astype(setup["dtype"])
        start += n
        datas.append(data)
        arrays.append(make_source(base / f"s{i}.zarr", data, chunks, shards))
    # mix opened arrays and paths as sources
    srcs = [a if i % 2 == 0 else base / f"s{i}.zarr" for i, a in enumerate(arrays)]
    ca = concat(srcs, setup["axis"], mode="r+")
    return ca, np.concatenate(datas, axis=setup["axis"])


@HYP
@given(setup=concat_setups(), data=st.data())
def test_property_reads(tmp_path_factory, setup: dict, data: st.DataObject) -> None:
    ca, model = build(tmp_path_factory.getbasetemp(), setup)
    assert ca.shape == model.shape
    np.testing.assert_array_equal(ca[...], model)
    for _ in range(8):
        key = data.draw(basic_indices(model.shape, allow_newaxis=True, allow_ellipsis=True))
        got, want = ca[key], model[key]
        assert np.shape(got) == np.shape(want), key
        np.testing.assert_array_equal(got, want, err_msg=str(key))
    for _ in range(3):
        bidx = tuple(data.draw(st.integers(0, g - 1)) for g in ca.cdata_shape)
        region = tuple(slice(b * c, (b + 1) * c) for b, c in zip(bidx, ca.chunks, strict=True))
        np.testing.assert_array_equal(ca.blocks[bidx], model[region])


@HYP
@given(setup=concat_setups(), data=st.data())
def test_property_writes(tmp_path_factory, setup: dict, data: st.DataObject) -> None:
    ca, model = build(tmp_path_factory.getbasetemp(), setup)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(4):
        key = data.draw(basic_indices(model.shape, allow_newaxis=True, allow_ellipsis=True))
        target_shape = np.shape(model[key])
        if data.draw(st.booleans()):
            value = rng.integers(-1000, 1000, size=target_shape).astype(model.dtype)
        else:
            value = model.dtype.type(rng.integers(0, 1000))  # scalar broadcast
        model[key] = value
        ca[key] = value
        # each source holds exactly its slice of the model: nothing leaked elsewhere
        for got, want in zip(source_data(ca), split_model(model, ca), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=str(key))


@HYP
@given(setup=concat_setups(max_sources=4), data=st.data())
def test_property_chunks(tmp_path_factory, setup: dict, data: st.DataObject) -> None:
    ca, model = build(tmp_path_factory.getbasetemp(), setup)
    straddling = set(ca.straddling_chunks())
    assert ca.count_straddling_chunks() == len(straddling)
    for coords in itertools.product(*(range(g) for g in ca.cdata_shape)):
        parts = ca.chunk_sources(coords)
        assert (len(parts) > 1) == (coords in straddling)
        # the parts tile the chunk's view region along the axis
        region = ca.chunk_region(coords)
        spans = [v[ca.axis] for _, _, v in parts]
        assert spans[0].start == region[ca.axis].start and spans[-1].stop == region[ca.axis].stop
        for i, s_reg, v_reg in parts:
            np.testing.assert_array_equal(ca.sources[i][s_reg], model[v_reg])
    todo = sorted(straddling) or [tuple(g - 1 for g in ca.cdata_shape)]
    rng = np.random.default_rng(0)
    for coords in todo[:6]:
        np.testing.assert_array_equal(ca.read_chunk(coords), padded_chunk(model, ca, coords))
        new = rng.integers(1, 1000, size=ca.chunks).astype(model.dtype)
        ca.write_chunk(coords, new)
        region = ca.chunk_region(coords)
        model[region] = new[tuple(slice(0, r.stop - r.start) for r in region)]
        np.testing.assert_array_equal(ca.read_chunk(coords), padded_chunk(model, ca, coords))
    for got, want in zip(source_data(ca), split_model(model, ca), strict=True):
        np.testing.assert_array_equal(got, want)


def test_sharded_sources_and_negative_axis(tmp_path: Path) -> None:
    d1 = np.arange(6 * 7, dtype="i4").reshape(6, 7)
    d2 = -np.arange(6 * 5, dtype="i4").reshape(6, 5)
    a1 = make_source(tmp_path / "a.zarr", d1, (2, 2), shards=(4, 4))
    a2 = make_source(tmp_path / "b.zarr", d2, (3, 3))
    ca = concat([a1, a2], -1)
    assert ca.axis == 1 and ca.chunks == (2, 2)  # the inner chunk shape
    model = np.concatenate([d1, d2], axis=1)
    np.testing.assert_array_equal(ca[:, ::-1], model[:, ::-1])
    assert list(ca.straddling_chunks()) == [(0, 3), (1, 3), (2, 3)]
    ca.write_chunk((1, 3), np.full((2, 2), 5, dtype="i4"))
    model[2:4, 6:8] = 5
    for got, want in zip(source_data(ca), split_model(model, ca), strict=True):
        np.testing.assert_array_equal(got, want)


# -------------------------------------------------------- existence / deletion
def test_chunk_exists_and_delete(tmp_path: Path) -> None:
    d1 = np.arange(1, 1 + 4 * 5, dtype="i4").reshape(4, 5)
    d2 = np.arange(100, 100 + 3 * 5, dtype="i4").reshape(3, 5)
    a1 = make_source(tmp_path / "a.zarr", d1, (2, 5))
    a2 = make_source(tmp_path / "b.zarr", d2, (1, 5))
    ca = concat([a1, a2], 0)  # view chunks (2, 5): rows [0:2] [2:4] [4:6] [6:7]
    assert list(ca.straddling_chunks()) == []
    model = np.concatenate([d1, d2])
    assert all(ca.chunk_exists((i, 0)) for i in range(ca.cdata_shape[0]))
    # view chunk 2 = rows 4..5 = a2 rows 0..1: both whole a2 chunks -> keys deleted
    ca.delete_chunk((2, 0))
    model[4:6] = 0
    assert not (tmp_path / "b.zarr" / "c" / "0" / "0").exists()
    assert not (tmp_path / "b.zarr" / "c" / "1" / "0").exists()
    assert not ca.chunk_exists((2, 0))
    assert ca.chunk_exists((3, 0))
    np.testing.assert_array_equal(ca[...], model)
    np.testing.assert_array_equal(ca.read_chunk((2, 0)), np.zeros((2, 5), "i4"))


def test_delete_partial_source_chunk(tmp_path: Path) -> None:
    d1 = np.arange(1, 4, dtype="i4")
    d2 = np.arange(10, 15, dtype="i4")
    a1 = make_source(tmp_path / "a.zarr", d1, (3,))
    a2 = make_source(tmp_path / "b.zarr", d2, (4,))
    ca = concat([a1, a2], 0)  # view chunks of 3 -> [0:3] [3:6] [6:8]
    model = np.concatenate([d1, d2])
    ca.delete_chunk((1,))  # a2[0:3]: part of a2's chunk 0 -> filled, chunk kept
    model[3:6] = 0
    np.testing.assert_array_equal(ca[...], model)
    assert ca.chunk_exists((1,))  # a2 chunk 0 still holds a2[3] = 13
    ca.delete_chunk((2,))  # a2[3:5]: a2[3] ends chunk 0 partially, chunk 1 (a2[4]) whole
    model[6:8] = 0
    np.testing.assert_array_equal(ca[...], model)
    assert not (tmp_path / "b.zarr" / "c" / "1").exists()


# ------------------------------------------------------------------ refusals
@pytest.fixture
def base_source(tmp_path: Path) -> Path:
    make_source(tmp_path / "base.zarr", np.zeros((4, 5, 6), "u2"), (2, 2, 2))
    return tmp_path / "base.zarr"


@pytest.mark.parametrize(
    ("shape", "dtype", "axis", "needles"),
    [
        ((4, 3, 6), "i2", 1, ["source 2", "other.zarr", "dtype int16", "uint16"]),
        ((4, 3), "u2", 1, ["source 2", "other.zarr", "rank 2", "rank 3"]),
        ((4, 3, 7), "u2", 1, ["source 2", "other.zarr", "extent 7 along axis 2", "6"]),
        ((3, 5, 6), "u2", 1, ["source 2", "extent 3 along axis 0", "only axis 1 may differ"]),
        ((4, 5, 9), "u2", -1, []),  # fine along the last axis
    ],
)
def test_mismatch_refused(base_source: Path, tmp_path: Path, shape, dtype, axis, needles) -> None:
    other = tmp_path / "other.zarr"
    make_source(other, np.zeros(shape, dtype), (2,) * len(shape))
    srcs = [base_source, base_source, other]
    if not needles:
        assert concat(srcs, axis).shape == (4, 5, 21)
        return
    with pytest.raises(SourceMismatchError) as exc:
        concat(srcs, axis)
    msg = str(exc.value)
    for needle in needles:
        assert needle in msg, msg
    with pytest.raises(SourceMismatchError):
        save_concat(tmp_path / "x.json", [str(s) for s in srcs], axis)
    assert not (tmp_path / "x.json").exists()


def test_names_and_stores(base_source: Path) -> None:
    store = zarr.storage.LocalStore(base_source)
    ca = concat([store, base_source], 2, names=["first", "second"])
    assert ca.names == ("first", "second") and ca.shape == (4, 5, 12)
    assert [s["name"] for s in describe(ca)["sources"]] == ["first", "second"]
    assert concat([store, base_source], 0).names[1] == os.fspath(base_source)


def test_bad_arguments_refused(base_source: Path) -> None:
    with pytest.raises(SourceMismatchError, match="at least one source"):
        concat([], 0)
    for axis in (3, -4):
        with pytest.raises(SourceMismatchError, match=f"axis {axis} is out of range"):
            concat([base_source, base_source], axis)
    with pytest.raises(FileNotFoundError) as exc:
        concat([base_source, base_source.parent / "missing.zarr"], 0)
    assert any("source 1" in n for n in getattr(exc.value, "__notes__", []))


def test_bad_index_refused(base_source: Path) -> None:
    ca = concat([base_source, base_source], 0)
    with pytest.raises(IndexError):
        ca[8]
    with pytest.raises(IndexError):
        ca[0, 0, 0, 0]
    with pytest.raises(IndexError):
        ca[np.array([0, 1])]
    with pytest.raises(IndexError):
        ca.blocks[4]
    with pytest.raises(IndexError):
        ca.read_chunk((4, 0, 0))


# ---------------------------------------------------------- description file
def test_description_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj"
    outside = tmp_path / "outside"
    d1 = np.arange(12, dtype="f4").reshape(3, 4)
    d2 = np.arange(8, dtype="f4").reshape(2, 4) + 50
    make_source(proj / "data" / "a.zarr", d1, (2, 2))
    make_source(outside / "b.zarr", d2, (1, 3))
    desc = proj / "cat.json"
    monkeypatch.chdir(proj)  # a cwd-relative source is stored relative to the file
    save_concat(desc, ["data/a.zarr", str(outside / "b.zarr")], 0)
    doc = json.loads(desc.read_text())
    assert doc == {
        "zfuse_concat": 1,
        "axis": 0,
        "sources": ["data/a.zarr", os.fspath(outside / "b.zarr")],
    }
    assert is_concat_description(desc)
    assert not is_concat_description(proj / "data" / "a.zarr")
    assert not is_concat_description(proj / "data" / "a.zarr" / "zarr.json")
    assert not is_concat_description(tmp_path / "nope.json")
    # move the project: the relative source follows, the absolute one stays
    moved = tmp_path / "moved"
    shutil.move(proj, moved)
    monkeypatch.chdir(tmp_path)
    ca = load_concat(moved / "cat.json")
    np.testing.assert_array_equal(ca[...], np.concatenate([d1, d2]))
    assert ca.names[0] == os.fspath(moved / "data" / "a.zarr")
    ca = load_concat(moved / "cat.json", mode="r+")
    ca[2:4] = -1
    np.testing.assert_array_equal(zarr.open_array(moved / "data" / "a.zarr")[2], [-1] * 4)
    np.testing.assert_array_equal(zarr.open_array(outside / "b.zarr")[0], [-1] * 4)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"other": 1}',
        '{"zfuse_concat": 2, "axis": 0, "sources": ["a"]}',
        '{"zfuse_concat": 1, "axis": "0", "sources": ["a"]}',
        '{"zfuse_concat": 1, "axis": 0, "sources": []}',
    ],
)
def test_bad_description_refused(tmp_path: Path, text: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(MetadataError):
        load_concat(p)


def test_delete_and_exists_sharded(tmp_path: Path) -> None:
    d1 = np.arange(1, 1 + 6 * 4, dtype="i4").reshape(6, 4)
    d2 = np.arange(100, 100 + 3 * 4, dtype="i4").reshape(3, 4)
    a1 = make_source(tmp_path / "a.zarr", d1, (2, 2), shards=(4, 4))
    a2 = make_source(tmp_path / "b.zarr", d2, (3, 4))
    ca = concat([a1, a2], 0)  # view chunks (2, 2): rows [0:2] [2:4] [4:6] [6:8] [8:9]
    model = np.concatenate([d1, d2])
    for coords in [(0, 0), (2, 1), (3, 0)]:
        ca.delete_chunk(coords)
        model[ca.chunk_region(coords)] = 0
    np.testing.assert_array_equal(ca[...], model)
    for got, want in zip(source_data(ca), split_model(model, ca), strict=True):
        np.testing.assert_array_equal(got, want)
    # a2 still has data in its only chunk; a1's second shard row still exists
    assert ca.chunk_exists((4, 0)) and ca.chunk_exists((2, 1))
    ca[4:6] = 0  # a1's second shard row becomes empty: zarr drops it
    assert not ca.chunk_exists((2, 0))


def test_read_only_sources_refuse_writes(base_source: Path) -> None:
    ca = concat([base_source, base_source], 0)  # default mode "r"
    assert ca.read_only
    how = 'to write, open it with mode="r+": zfuse.concat(sources, axis, mode="r+")'
    for write in (lambda: ca.__setitem__(0, 1), lambda: ca.write_chunk((0, 0), np.zeros(ca.chunks)),
                  lambda: ca.delete_chunk((0, 0))):
        with pytest.raises(ReadOnlyArrayError, match="read-only") as info:
            write()
        assert "source 0 (" in str(info.value) and how in str(info.value)
    np.testing.assert_array_equal(ca[...], 0)
    assert not concat([base_source, base_source], 0, mode="r+").read_only


def test_a_source_listed_thousands_of_times_is_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[hostile-10] a description file listing one source 5,000 times (before: 5,000
    opens, 25 s for 20,000): the source is opened once and read at every offset."""
    from zfuse.ext import concat as concat_module

    src = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 4), chunks=(2, 2), dtype="u1")
    src[...] = np.arange(16, dtype="u1").reshape(4, 4)
    (tmp_path / "c.json").write_text(json.dumps({"zfuse_concat": 1, "axis": 0, "sources": ["a.zarr"] * 5000}))
    real, opens = concat_module._open, []
    monkeypatch.setattr(concat_module, "_open", lambda *a, **k: (opens.append(a[0]), real(*a, **k))[1])
    ca = concat_module.load_concat(tmp_path / "c.json")
    assert len(opens) == 1 and ca.shape == (20_000, 4)
    np.testing.assert_array_equal(np.asarray(ca[19_996:20_000]), np.arange(16, dtype="u1").reshape(4, 4))


def test_a_fifo_in_place_of_a_description_is_refused_not_waited_on(tmp_path) -> None:
    """A description file swapped for a FIFO (between a reload's looks at the path) is
    refused at once: opening it blocked the reload, every later one, and the unmount."""
    import os
    import threading

    from zfuse.errors import MetadataError
    from zfuse.ext.concat import load_concat

    fifo = tmp_path / "c.json"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_concat(fifo)
        except BaseException as e:  # noqa: BLE001 - kept for the assertion
            outcome.append(e)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():
        with open(fifo, "wb"):  # (lets the blocked open go)
            pass
        pytest.fail("loading a FIFO description waited for a writer")
    assert len(outcome) == 1 and isinstance(outcome[0], MetadataError), outcome
    assert "not a regular file" in str(outcome[0])


def test_the_view_writes_through_its_parts_and_sees_what_it_wrote(tmp_path: Path) -> None:
    """A concatenation's chunk source writes and deletes through its parts, never past
    them: a sharded part's cached shard index is forgotten (`chunk_exists` saw a written
    chunk as absent, a deleted one as stored), and the whole-array listing `ls` falls
    back on is made anew (a chunk written through the mount left `ls` once the listing
    cache let its directory go)."""
    from zfuse.view.array_view import ArrayView, ChunkCache, ViewOptions
    from zfuse.view.concat_source import ConcatChunkSource

    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1",
                          fill_value=0)
    zarr.create_array(str(tmp_path / "b.zarr"), shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1", fill_value=0)
    a[0:2, 0:2] = 1
    parts = [zarr.open_array(str(tmp_path / n), mode="r+") for n in ("a.zarr", "b.zarr")]
    source = ConcatChunkSource(concat(parts, axis=0))
    assert not source.chunk_exists((0, 1))  # (part a's shard index now cached)
    source.write_chunk((0, 1), np.full((2, 2), 7, "u1"))
    assert zarr.open_array(str(tmp_path / "a.zarr"))[0:2, 2:4].tolist() == [[7, 7], [7, 7]]
    assert source.chunk_exists((0, 1))
    source.delete_chunk((0, 0))
    assert not source.chunk_exists((0, 0))
    assert zarr.open_array(str(tmp_path / "a.zarr"))[0:2, 0:2].tolist() == [[0, 0], [0, 0]]

    c = zarr.create_array(str(tmp_path / "c.zarr"), shape=(4, 4), chunks=(2, 2), dtype="u1", fill_value=0)
    zarr.create_array(str(tmp_path / "d.zarr"), shape=(4, 4), chunks=(2, 2), dtype="u1", fill_value=0)
    c[0:2, 0:2] = 1
    flat = ConcatChunkSource(concat([zarr.open_array(str(tmp_path / n), mode="r+") for n in ("c.zarr", "d.zarr")],
                                    axis=0))
    arr = ArrayView(flat, ViewOptions(), ChunkCache(1 << 20))

    def listed() -> list[str]:
        return sorted(n for page in arr.iter_dir(("c", "0")) for n, _ in page)

    assert listed() == ["0.tiff"]
    flat.write_chunk((0, 1), np.full((2, 2), 7, "u1"))
    arr.add_chunk((0, 1))  # (what a commit does)
    arr.caches.names.clear()  # (the listing cache lets the directory go)
    assert listed() == ["0.tiff", "1.tiff"]


def test_view_chunks_sharing_a_source_shard_are_written_one_at_a_time(tmp_path: Path) -> None:
    """View chunks that lie in one shard of a source, written from two threads at once,
    each once: none is lost (each write rewrites the shard under the part's lock for
    it; through zarr's indexing alone, two rewrites of one shard lost one of them)."""
    import threading

    from zfuse.view.concat_source import ConcatChunkSource

    for name in ("a.zarr", "b.zarr"):  # one shard each, of 32 inner chunks
        zarr.create_array(str(tmp_path / name), shape=(2, 128), chunks=(2, 4), shards=(2, 128), dtype="u1",
                          fill_value=0)
    source = ConcatChunkSource(concat([zarr.open_array(str(tmp_path / n), mode="r+") for n in ("a.zarr", "b.zarr")],
                                      axis=0))
    errors: list[BaseException] = []

    def writer(columns: range) -> None:
        try:
            for c in columns:
                source.write_chunk((0, c), np.full((2, 4), c + 1, "u1"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(range(first, 32, 2),)) for first in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stored = zarr.open_array(str(tmp_path / "a.zarr"))[...]
    np.testing.assert_array_equal(stored, np.repeat(np.arange(1, 33, dtype="u1"), 4)[None].repeat(2, 0))


def _listing(source, parts: tuple[str, ...]) -> list[tuple[str, object]]:
    return [entry for page in source.iter_chunk_dir(parts) for entry in page]


def test_one_big_source_chunk_over_small_view_chunks_is_listed_by_directory(tmp_path: Path) -> None:
    """[hostile-4] a (1, 8192) source in (1, 1) chunks before an (8192, 8192) one of a
    single stored chunk: the view's grid is (1, 1), so that chunk covers 67 million view
    chunks. A directory lists its 8,192 names from the sources' stored chunks, in pages
    (the whole view had been listed into one set at the first `ls`: 3.5 GB, then a hung
    mount); the whole-array listing `zfuse info` counts with stops at LISTED_MAX."""
    import tracemalloc

    from zfuse.errors import ZfuseError
    from zfuse.view.concat_source import LISTED_MAX, ConcatChunkSource

    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(1, 8192), chunks=(1, 1), dtype="u1", fill_value=0)
    a[0, :2] = 5
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=(8192, 8192), chunks=(8192, 8192), dtype="u1",
                          fill_value=0, compressors=[zarr.codecs.ZstdCodec()])
    b[:1, :1] = 1  # (one stored chunk, the whole array)
    source = ConcatChunkSource(concat([str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")], axis=0))
    tracemalloc.start()
    try:
        assert _listing(source, ()) == [("c", None)]
        rows = _listing(source, ("c",))
        assert len(rows) == 8193 and rows[0] == ("0", None) and rows[-1] == ("8192", None)
        assert _listing(source, ("c", "0")) == [("0", (0, 0)), ("1", (0, 1))]
        pages = list(source.iter_chunk_dir(("c", "8000")))
        assert max(len(p) for p in pages) <= 1000 and sum(len(p) for p in pages) == 8192
        assert pages[0][0] == ("0", (8000, 0))
        with pytest.raises(ZfuseError, match=f"more than {LISTED_MAX} view chunks"):
            source.list_chunks()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 400 << 20, peak
    assert source.chunk_exists((5000, 17)) and not source.chunk_exists((0, 2))


def test_a_straddling_view_chunk_is_decoded_within_bounds(tmp_path: Path) -> None:
    """[hostile-12] a view chunk that is no one source chunk is assembled from the source
    chunks it overlaps, each decoded by its part within its bound: a 64 KB zstd frame of
    512 MiB stored as a (4, 4) chunk is refused as corrupt (zarr's indexing, used before,
    decoded it all: 2 GB of a 2 GiB one); sound chunks assemble to what zarr reads."""
    import tracemalloc

    import numcodecs

    from zfuse.errors import CorruptDataError
    from zfuse.view.concat_source import ConcatChunkSource

    zarr.create_array(str(tmp_path / "a.zarr"), shape=(2, 8), chunks=(2, 2), dtype="u1", fill_value=0)[...] = 3
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=(8, 8), chunks=(4, 4), dtype="u1", fill_value=0,
                          compressors=[zarr.codecs.ZstdCodec()])
    b[...] = np.arange(64, dtype="u1").reshape(8, 8)
    source = ConcatChunkSource(concat([str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")], axis=0))
    for coords in itertools.product(range(5), range(4)):
        expect = np.concatenate([np.full((2, 8), 3, "u1"), b[...]])[source.chunk_region(coords)]
        np.testing.assert_array_equal(source.read_chunk(coords), expect, err_msg=str(coords))
    bomb = numcodecs.Zstd(level=1).encode(np.zeros(1 << 29, "u1"))  # 512 MiB of zeros in 16 KB
    (tmp_path / "b.zarr" / "c" / "0" / "0").write_bytes(bomb)
    source = ConcatChunkSource(concat([str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")], axis=0))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError):
            source.read_chunk((1, 0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_one_array_twice_in_a_read_write_concatenation_is_refused(tmp_path: Path) -> None:
    """[hostile-10] One array named twice (or by two spellings) in a read-write concatenation: a write
    through one view chunk left the other's copy stale, so it is refused, naming both and
    the way out; read-only it is shown."""
    from zfuse.view.concat_source import ConcatChunkSource

    zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 4), chunks=(4, 4), dtype="u1", fill_value=0)
    zarr.create_array(str(tmp_path / "b.zarr"), shape=(4, 4), chunks=(4, 4), dtype="u1", fill_value=0)
    for names in (["a.zarr", "b.zarr", "a.zarr"], ["a.zarr", "./b.zarr/../a.zarr"]):
        paths = [str(tmp_path / n) for n in names]
        with pytest.raises(MetadataError, match=r"are one array.*-o ro"):
            ConcatChunkSource(concat(paths, axis=0, mode="r+"))
        assert ConcatChunkSource(concat(paths, axis=0)).shape[0] == 4 * len(names)


def test_descriptions_name_what_cannot_be_a_source(tmp_path: Path) -> None:
    """A description naming another description, or nested 100,000 deep, is refused
    naming why (it was "File exists", "no Zarr metadata", or a RecursionError)."""
    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view

    zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 4), chunks=(4, 4), dtype="u1", fill_value=0)
    save_concat(tmp_path / "inner.json", [tmp_path / "a.zarr", tmp_path / "a.zarr"], axis=0)
    (tmp_path / "outer.json").write_text(json.dumps({"zfuse_concat": 1, "axis": 0,
                                                     "sources": ["a.zarr", "inner.json"]}))
    for read_only in (True, False):
        with pytest.raises(MetadataError, match="inner.json: not a directory, so no Zarr store"):
            make_view(MountConfig([str(tmp_path / "outer.json")], "/unused", read_only=read_only))
    (tmp_path / "deep.json").write_text('{"zfuse_concat": 1, "axis": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(MetadataError, match="JSON nested 100001 deep"):
        load_concat(tmp_path / "deep.json")


def test_a_listing_made_across_a_write_is_not_kept(tmp_path: Path) -> None:
    """A directory listed while a write lands (the part listed, then the write forgets
    the listings, then the listing is kept): the next listing shows the written chunk
    (it stayed missing from `ls` until the next write)."""
    from zfuse.view.concat_source import ConcatChunkSource

    for n in ("a", "b"):
        zarr.create_array(str(tmp_path / f"{n}.zarr"), shape=(2, 4), chunks=(2, 2), dtype="u1", fill_value=0)
    source = ConcatChunkSource(concat([str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")], axis=0, mode="r+"))
    part = source.parts[0]
    listed_before = part.list_chunks

    def list_then_a_write_lands() -> list:
        listed = listed_before()
        source.write_chunk((0, 1), np.full((2, 2), 7, "u1"))
        return listed

    part.list_chunks = list_then_a_write_lands  # type: ignore[method-assign]
    _listing(source, ("c", "0"))
    part.list_chunks = listed_before  # type: ignore[method-assign]
    assert _listing(source, ("c", "0")) == [("1", (0, 1))]


def test_a_row_of_a_concatenation_of_many_sources_lists_its_own_sources(tmp_path: Path) -> None:
    """[hostile-10] one array named 20,000 times: it is listed once (each occurrence had
    listed it again), and a row's directory looks at the sources of that row only."""
    from zfuse.view.concat_source import ConcatChunkSource

    zarr.create_array(str(tmp_path / "a.zarr"), shape=(1, 4), chunks=(1, 2), dtype="u1", fill_value=0)[0, :2] = 1
    save_concat(tmp_path / "many.json", [tmp_path / "a.zarr"] * 20_000, axis=0)
    source = ConcatChunkSource(load_concat(tmp_path / "many.json"))
    listings = []
    listed = source.parts[0].list_chunks

    def counted() -> list:
        listings.append(1)
        return listed()

    for part in source.parts:
        part.list_chunks = counted  # type: ignore[method-assign]
    assert _listing(source, ("c", "19999")) == [("0", (19999, 0))]
    assert len(source._ranges) == 1 and len(listings) == 1  # (that row's source, listed once)
    rows = _listing(source, ("c",))
    assert len(rows) == 20_000 and len(listings) == 1


def test_a_listing_made_during_a_refresh_is_not_kept(tmp_path: Path) -> None:
    """A directory of a concatenation listed while a refresh (metadata_ttl, reload) runs,
    between the parts forgetting their shard indexes and the view its listings: a chunk
    written behind the mount is listed after the refresh (it stayed missing)."""
    from zfuse.view.concat_source import ConcatChunkSource

    for n in ("a", "b"):
        zarr.create_array(str(tmp_path / f"{n}.zarr"), shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="u1",
                          fill_value=0)[0:2, 0:2] = 1
    source = ConcatChunkSource(concat([str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")], axis=0))
    assert [n for n, _ in _listing(source, ("c", "2"))] == ["0"]
    zarr.open_array(str(tmp_path / "b.zarr"), mode="r+")[0:2, 2:4] = 7  # (another process)
    part = source.parts[1]
    given = part.invalidate

    def invalidate_with_a_listing_meanwhile() -> None:
        _listing(source, ("c", "2"))
        given()

    part.invalidate = invalidate_with_a_listing_meanwhile  # type: ignore[method-assign]
    source.invalidate()
    assert [n for n, _ in _listing(source, ("c", "2"))] == ["0", "1"]
