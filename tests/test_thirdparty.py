"""Zarr data written by other implementations (../shared/thirdparty-zarr/), mounted.

For every store there (SOURCES.md says where each came from):
- every array zarr-python reads (zarr-python with zfuse's extensions, in
  process) is shown: each chunk file read by tifffile equals zarr-python's
  values for that chunk, and the view's dual-access ``zarr.json`` opened by
  zarr-python on the mount reads the whole array back equal;
- every array zarr-python cannot read (or that has no TIFF form) is a
  directory with ``zarr.json`` and a ``README`` naming the array and the
  cause, the mount is up, and ``zfuse info`` lists it with the same reason;
- nothing is printed as an unretrieved task exception or a traceback.

Hierarchies are mounted one each. The ~290 single-array stores (mostly the
zarrs snapshot arrays) would cost a daemon start each, so they are mounted
together: a temporary group per Zarr format whose members are the stores,
hard-linked (no data is copied; a mount follows no symbolic link out of its store). Each
single-array store is also opened on its own in process, where an array
zarr-python cannot read must be refused with its own reason.

The data is used read-only (``-o ro``); nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import zarr

from zfuse.daemon import MountConfig
from zfuse.errors import MetadataError
from zfuse.ext.api import open_array
from zfuse.info import describe_source
from zfuse.open_view import make_view

THIRDPARTY = Path(__file__).resolve().parents[2] / "shared" / "thirdparty-zarr"
# chunk files compared per array: all of them up to this many, else an even sample
MAX_CHUNK_FILES = 40

pytestmark = pytest.mark.mount


def _require_data() -> None:
    # present wherever the suite runs (CI included): a missing folder is a failure
    if not (THIRDPARTY / "SOURCES.md").is_file():
        pytest.fail(f"third-party Zarr data missing: {THIRDPARTY} (see the project's shared folder)")


# -- finding stores and arrays on disk (independently of zfuse) -------------------


def _doc(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _is_legacy(root: Path) -> bool:
    doc = _doc(root / "zarr.json")
    return doc is not None and "metadata_encoding" in doc


def node_kind(path: Path) -> str | None:
    """"array" / "group" as the directory's own metadata says, or None."""
    doc = _doc(path / "zarr.json")
    if doc is not None and "metadata_encoding" not in doc:
        return doc.get("node_type") if doc.get("node_type") in ("array", "group") else None
    if (path / ".zarray").is_file():
        return "array"
    if (path / ".zgroup").is_file() or doc is not None:
        return "group"
    return None


def zarr_format_of(path: Path) -> int:
    return 3 if (path / "zarr.json").is_file() else 2


def find_stores() -> list[Path]:
    """Topmost Zarr nodes under THIRDPARTY: each is a store."""
    stores = []
    for dirpath, dirnames, _ in os.walk(THIRDPARTY):
        here = Path(dirpath)
        if node_kind(here) is not None:
            stores.append(here)
            dirnames[:] = []
        dirnames.sort()
    return sorted(stores)


def arrays_in(root: Path) -> list[str]:
    """Paths (relative to `root`) of the arrays zarr-python reads by path: every
    array not inside another array ("" for a single-array store). Directories
    without group metadata on the way (``A/`` of an OME-Zarr plate) are
    crossed: zarr-python opens ``A/1/0`` by path."""
    if _is_legacy(root):  # pre-release v3 layout: meta/root/<path>.array.json
        meta = root / "meta" / "root"
        return sorted(str(p.relative_to(meta))[: -len(".array.json")] for p in meta.rglob("*.array.json"))
    out: list[str] = []

    def walk(path: Path, rel: str) -> None:
        kind = node_kind(path)
        if kind == "array":
            out.append(rel)
        elif kind == "group" or path != root:
            for child in sorted(path.iterdir()):
                if child.is_dir() and not child.name.startswith("."):
                    walk(child, f"{rel}/{child.name}" if rel else child.name)

    walk(root, "")
    return out


# -- the reference: zarr-python in process ------------------------------------------


@dataclass
class Expected:
    """One array: where it is in the mount, and zarr-python's view of it."""

    mount_path: str  # relative to the mount root
    store: Path
    path: str  # inside the store
    values: np.ndarray | None = None  # None: zarr-python cannot read it
    chunks: tuple[int, ...] = ()
    fill: Any = None
    error: str = ""
    tokens: list[str] = field(default_factory=list)  # words a reason must use one of

    @property
    def readable(self) -> bool:
        return self.values is not None

    @property
    def tiff(self) -> bool:
        return self.readable and self.values.dtype.kind in "biufc" and self.values.dtype.fields is None


def _stored_doc(store: Path, path: str) -> dict[str, Any]:
    where = store / path if path else store
    return _doc(where / "zarr.json") or _doc(where / ".zarray") or {}


def cause_tokens(doc: dict[str, Any]) -> list[str]:
    """Names of the things that can make an array unreadable: data type, codecs, fields."""
    tokens = ["fill_value", "storage_transformers", "TIFF"]
    dtype = doc.get("data_type", doc.get("dtype"))
    if dtype is not None:
        tokens.append(dtype if isinstance(dtype, str) else json.dumps(dtype))
        if isinstance(dtype, dict):
            tokens.append(str(dtype.get("name")))
    pending = list(doc.get("codecs") or ()) + list(doc.get("filters") or ()) + [doc.get("compressor")]
    while pending:
        codec = pending.pop()
        if isinstance(codec, str):
            tokens.append(codec)
        elif isinstance(codec, dict):
            tokens.append(str(codec.get("name", codec.get("id"))))
            pending += list((codec.get("configuration") or {}).get("codecs") or ())
    for t in doc.get("storage_transformers") or ():
        tokens.append(str(t.get("name")))
    return tokens


def reference(mount_path: str, store: Path, path: str) -> Expected:
    exp = Expected(mount_path, store, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = open_array(str(store), mode="r", path=path or None)
            exp.values = np.asarray(arr[...])
        exp.chunks = tuple(arr.chunks)
        exp.fill = arr.fill_value
    except Exception as e:
        exp.error = f"{type(e).__name__}: {e}"
        exp.tokens = cause_tokens(_stored_doc(store, path))
    return exp


# -- what gets mounted ------------------------------------------------------------------


@dataclass
class MountPlan:
    source: Path
    arrays: list[Expected]


def _single_array_tree(tmp: Path, stores: list[Path], zarr_format: int) -> Path:
    """A group whose members are symlinks to single-array stores, at their
    paths relative to THIRDPARTY (intermediate directories become groups)."""
    root = tmp / f"single-array-stores-v{zarr_format}"

    def make_group(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if zarr_format == 3:
            (path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
        else:
            (path / ".zgroup").write_text('{"zarr_format": 2}')

    make_group(root)
    for store in stores:
        rel = store.relative_to(THIRDPARTY)
        for i in range(1, len(rel.parts)):
            make_group(root.joinpath(*rel.parts[:i]))
        # hard links, not a symbolic link: a mount follows no link out of its store
        shutil.copytree(store, root / rel, copy_function=_link_or_copy)
    return root


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def single_array_stores() -> list[Path]:
    return [s for s in find_stores() if node_kind(s) == "array"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MountPlan]:
    _require_data()
    out: dict[str, MountPlan] = {}
    singles: dict[int, list[Path]] = {2: [], 3: []}
    for store in find_stores():
        if node_kind(store) == "array" and not _is_legacy(store):
            singles[zarr_format_of(store)].append(store)
            continue
        rel = str(store.relative_to(THIRDPARTY))
        out[rel] = MountPlan(store, [reference(p, store, p) for p in arrays_in(store)])
    tmp = tmp_path_factory.mktemp("thirdparty")
    for fmt, stores in singles.items():
        tree = _single_array_tree(tmp, stores, fmt)
        arrays = [reference(str(s.relative_to(THIRDPARTY)), s, "") for s in stores]
        out[f"single-array stores (zarr v{fmt})"] = MountPlan(tree, arrays)
    return out


def plan_names() -> list[str]:
    if not (THIRDPARTY / "SOURCES.md").is_file():
        return ["<thirdparty-zarr missing>"]
    names = [str(s.relative_to(THIRDPARTY)) for s in find_stores()
             if node_kind(s) != "array" or _is_legacy(s)]
    return names + ["single-array stores (zarr v2)", "single-array stores (zarr v3)"]


# -- the checks ----------------------------------------------------------------------------


def sample(items: list[Path], n: int) -> list[Path]:
    """All items if there are at most n, else n spread evenly (first and last included)."""
    if len(items) <= n:
        return items
    picks = np.linspace(0, len(items) - 1, n).round().astype(int)
    return [items[i] for i in sorted(set(picks))]


def chunk_coords(exp: Expected, rel_file: str, view_doc: dict[str, Any]) -> tuple[int, ...]:
    """The chunk a file name encodes (its integers after the key's own prefix)."""
    key = rel_file[: -len(".tiff")]
    base = view_doc["chunk_key_encoding"]["configuration"]["base_encoding"]
    sep = (base.get("configuration") or {}).get("separator", "/" if base["name"] == "default" else ".")
    if base["name"] == "default":
        assert key.startswith("c"), key
        key = key[1:].lstrip(sep)
    if exp.values.ndim == 0:
        return ()
    return tuple(int(p) for p in key.split(sep))


def check_shown(mnt: Path, exp: Expected) -> int:
    """Chunk files and dual-access array equal zarr-python's; returns files compared."""
    where = mnt / exp.mount_path if exp.mount_path else mnt
    assert not (where / "README").exists(), (where / "README").read_text()
    view_doc = json.loads((where / "zarr.json").read_text())
    assert view_doc["node_type"] == "array", view_doc
    inner = tuple(view_doc["chunk_grid"]["configuration"]["chunk_shape"])
    files = sorted(p for p in where.rglob("*.tiff") if p.is_file())
    values = exp.values
    compared = 0
    for f in sample(files, MAX_CHUNK_FILES):
        coords = chunk_coords(exp, str(f.relative_to(where)), view_doc)
        region = tuple(slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, inner, values.shape, strict=True))
        got = tifffile.imread(f)
        assert got.size == int(np.prod(inner)), (f, got.shape, inner)
        got = got.reshape(inner)[tuple(slice(0, r.stop - r.start) for r in region)]
        np.testing.assert_array_equal(got, values[region], err_msg=f"{exp.mount_path}: {f.name}")
        compared += 1
    # the mount itself, opened by zarr-python through the view's zarr.json
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dual = zarr.open_array(str(where), mode="r")
        back = np.asarray(dual[...])
    assert back.shape == values.shape
    assert back.dtype == values.dtype.newbyteorder("="), (back.dtype, values.dtype)
    np.testing.assert_array_equal(back, values, err_msg=f"{exp.mount_path}: dual-access array")
    return compared


def check_not_shown(mnt: Path, exp: Expected, reasons: dict[str, str]) -> None:
    where = mnt / exp.mount_path if exp.mount_path else mnt
    assert os.path.ismount(mnt), "the mount went down"
    assert sorted(os.listdir(where)) == ["README", "zarr.json"], (exp.mount_path, os.listdir(where))
    readme = (where / "README").read_text()
    assert f"'{exp.mount_path or '/'}'" in readme, readme
    json.loads((where / "zarr.json").read_text())
    if exp.readable:  # read by zarr-python, but no TIFF form: the data type is the cause
        assert "TIFF" in readme, readme
    else:
        assert any(t in readme for t in exp.tokens), (readme, exp.tokens, exp.error)
        assert "Task exception" not in readme and "Traceback" not in readme
    assert reasons.get(exp.mount_path or "/") in readme, (exp.mount_path, reasons)


@pytest.mark.parametrize("name", plan_names())
def test_every_array_shown_or_explained(name: str, plans: dict[str, MountPlan], mount) -> None:
    """[tree-2] [tree-5] [read-6] every third-party array: shown equal to zarr-python, or
    a directory whose README names it and the cause; the mount stays up."""
    plan = plans[name]
    assert plan.arrays, f"{name}: no arrays found"
    m = mount(plan.source, "-o", "ro")
    report = describe_source(MountConfig([str(plan.source)], str(m.path), read_only=True))
    reasons = {a["path"]: a["why_not"] for a in report["arrays"] if not a["shown"]}
    shown = compared = 0
    for exp in plan.arrays:
        if exp.tiff:
            compared += check_shown(m.path, exp)
            shown += 1
        else:
            check_not_shown(m.path, exp, reasons)
    assert set(reasons) == {e.mount_path or "/" for e in plan.arrays if not e.tiff}
    log = m.log()
    assert "Task exception was never retrieved" not in log and "Traceback" not in log, log[-3000:]
    print(f"{name}: {shown} arrays shown ({compared} chunk files compared), "
          f"{len(plan.arrays) - shown} explained")


def test_single_array_stores_open_or_are_refused_with_their_reason() -> None:
    """A single-array store zarr-python cannot read is refused with the array's own
    reason (never the group attempt's ContainsArrayError); the others open."""
    _require_data()
    refused = 0
    for store in single_array_stores():
        exp = reference("", store, "")
        config = MountConfig([str(store)], "/nonexistent", read_only=True)
        if exp.readable:
            view = make_view(config)
            assert len(list(view.arrays())) == 1
            continue
        with pytest.raises(MetadataError) as info:
            make_view(config)
        message = str(info.value)
        assert str(store) in message and "ContainsArrayError" not in message, message
        assert any(t in message for t in exp.tokens), (message, exp.tokens)
        refused += 1
    assert refused > 0


def iter_plan_arrays(plans: dict[str, MountPlan]) -> Iterator[Expected]:
    for plan in plans.values():
        yield from plan.arrays


def test_the_data_covers_what_the_issue_names(plans: dict[str, MountPlan]) -> None:
    """Guard against the walk silently finding less: the kinds of arrays the
    tests above must have seen are all there."""
    arrays = list(iter_plan_arrays(plans))
    readable = [e for e in arrays if e.tiff]
    assert len(readable) > 300, len(readable)
    paths = {e.mount_path for e in arrays}
    for must in ("1d.contiguous.shuffle.i2", "1d.contiguous.json2.O", "14/0"):
        assert must in paths, must
    assert sum(not e.readable for e in arrays) >= 30
