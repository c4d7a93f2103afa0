"""The layers README's "Layout of the code" names, checked on the source: which
module may import what, and no import cycles (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "zfuse"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(p) if m in modules and m != name} - {"zfuse"}
            for name, p in modules.items()}


def test_no_import_cycles() -> None:
    edges = graph()
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        for dep in sorted(edges[name]):
            assert dep not in stack, "import cycle: " + " -> ".join([*stack[stack.index(dep):], dep])
            if dep not in done:
                visit(dep, [*stack, dep])
        done.add(name)

    for name in sorted(edges):
        visit(name, [name])


# the store layer's modules (README's layout table): which of the others each may use
STORE_PARTS = {
    "zfuse.local_store": set(),  # a local directory, read beneath it only; atomic writes
    "zfuse.remote_objects": set(),  # remote objects with their versions; conditional writes
    "zfuse.store": {"zfuse.local_store", "zfuse.remote_objects"},  # open_store, MeteredStore
}


def test_store_layers_know_no_fuse() -> None:
    """The store layer's modules use only the store modules they are declared to (the
    local store and remote objects know nothing of each other, nor of the metered store
    that wraps them), and nothing of FUSE, trio, the view, the filesystem layer or the
    open files: they are plain zarr stores."""
    modules = {module_name(p): p for p in PACKAGE.glob("*.py")}
    for name, allowed in STORE_PARTS.items():
        found = imports_of(modules[name])
        parts = {m for m in found if m in STORE_PARTS}
        assert parts == allowed, f"{name} uses {parts}, declared {allowed}"
        bad = {m for m in found if m.split(".")[0] in ("pyfuse3", "trio") or m.startswith(
            ("zfuse.fs", "zfuse.fuse_ops", "zfuse.daemon", "zfuse.handles", "zfuse.view", "zfuse.open_view"))}
        assert not bad, f"{name} imports {bad}"


def test_the_filesystem_layer_reaches_stores_through_the_view() -> None:
    """The filesystem layer, the adapter and the open files never use the store layer:
    what they ask of stores (a failing chunk asked again) goes through the view, which
    holds the stores its sources were opened on."""
    users = {module_name(p) for p in PACKAGE.rglob("*.py") if module_name(p).startswith(
        ("zfuse.fs", "zfuse.fuse_ops", "zfuse.handles")) and set(imports_of(p)) & set(STORE_PARTS)}
    assert not users


def test_only_the_adapter_and_the_daemon_import_pyfuse3() -> None:
    users = {module_name(p) for p in PACKAGE.rglob("*.py") if any(
        m.split(".")[0] == "pyfuse3" for m in imports_of(p))}
    assert users == {"zfuse.fuse_ops", "zfuse.daemon"}


def test_extensions_and_view_know_no_fuse() -> None:
    """ext/: zarr only (no TIFF, no view); view/: no FUSE and no filesystem layer."""
    for path in (PACKAGE / "ext").rglob("*.py"):
        bad = {m for m in imports_of(path) if m.split(".")[0] == "pyfuse3" or m.startswith(
            ("zfuse.view", "zfuse.fs", "zfuse.fuse_ops", "zfuse.daemon", "tifffile"))}
        assert not bad, f"{path.name} imports {bad}"
    for path in (PACKAGE / "view").rglob("*.py"):
        bad = {m for m in imports_of(path) if m.split(".")[0] == "pyfuse3" or m.startswith(
            ("zfuse.fs", "zfuse.fuse_ops", "zfuse.daemon"))}
        assert not bad, f"{path.name} imports {bad}"


def test_handles_know_no_listing_and_no_fuse() -> None:
    """zfuse/handles.py, the kinds of open file: each reads what it owns. No listing code
    (the tree and its listings, a group's members, the listing caches, the hierarchy,
    the filesystem layer with its directory handles and listing ahead), no FUSE, no
    event loop, no store; only the filesystem layer uses them."""
    listing = ("zfuse.view.tree", "zfuse.view.members", "zfuse.view.caches", "zfuse.view.hierarchy", "zfuse.fs")
    bad = {m for m in imports_of(PACKAGE / "handles.py") if m.split(".")[0] in ("pyfuse3", "trio", "zarr")
           or m.startswith((*listing, "zfuse.fuse_ops", "zfuse.daemon", *STORE_PARTS))}
    assert not bad, f"handles.py imports {bad}"
    users = {module_name(p) for p in PACKAGE.rglob("*.py") if any(
        m.startswith("zfuse.handles") for m in imports_of(p))}
    assert users == {"zfuse.fs.filesystem"}


# the filesystem's parts (zfuse/fs/__init__.py's table): which other parts each may use
FS_PARTS = {
    "zfuse.fs.types": set(),
    "zfuse.fs.special": {"zfuse.fs.types"},
    "zfuse.fs.listing_ahead": {"zfuse.fs.types"},
    "zfuse.fs.stored_files": {"zfuse.fs.types"},
    "zfuse.fs.page_cache": {"zfuse.fs.types"},
    "zfuse.fs.read_ahead": {"zfuse.fs.types", "zfuse.fs.stored_files"},
    "zfuse.fs.image_push": {"zfuse.fs.types"},
}


def test_filesystem_parts_own_their_state_apart() -> None:
    """Each part of the filesystem layer uses only the parts it is declared to (never
    `FileSystem` itself, never the handle kinds); none imports FUSE or the store; the
    shared types import nothing of zfuse; only the read-ahead and listing-ahead parts
    know of background threads' jobs, and only listing ahead knows the tree's listings."""
    modules = {module_name(p): p for p in (PACKAGE / "fs").glob("*.py")}
    assert set(modules) == {*FS_PARTS, "zfuse.fs", "zfuse.fs.filesystem"}
    for name, allowed in FS_PARTS.items():
        found = imports_of(modules[name])
        parts = {m for m in found if m.startswith("zfuse.fs.") and m in FS_PARTS} | (
            {"zfuse.fs.filesystem"} & found)
        assert parts == allowed, f"{name} uses {parts}, declared {allowed}"
        bad = {m for m in found if m.split(".")[0] == "pyfuse3"
               or m.startswith(("zfuse.handles", *STORE_PARTS, "zfuse.fuse_ops", "zfuse.daemon"))}
        assert not bad, f"{name} imports {bad}"
        if name != "zfuse.fs.listing_ahead":
            assert "zfuse.view.tree.DirReader" not in found, f"{name} reads listings"
    assert not {m for m in imports_of(modules["zfuse.fs.types"]) if m.startswith("zfuse")}


def test_whole_image_parts() -> None:
    """view/whole_image/ (the package README's layout table names): no FUSE, no event
    loop, no listing, no open files; ome.py is text (its only part: layout's image
    dimensions); layout.py and header.py plan and write bytes (no tiles, no reads ahead);
    push.py decides, tiles.py reads; strips.py (image.tif) writes its own header with
    header.py's IFD writer and reads with tiles.py's chunk planes; slide.py plans; file.py
    is the reads every file answers; only image.py ties them."""
    pkg = PACKAGE / "view" / "whole_image"
    part = "zfuse.view.whole_image."
    for path in pkg.glob("*.py"):
        bad = {m for m in imports_of(path) if m.split(".")[0] in ("pyfuse3", "trio") or m.startswith(
            ("zfuse.fs", "zfuse.fuse_ops", "zfuse.daemon", "zfuse.handles", "zfuse.view.tree", *STORE_PARTS))}
        assert not bad, f"whole_image/{path.name} imports {bad}"
    own = {p.stem: {m.removeprefix(part).split(".")[0] for m in imports_of(p) if m.startswith(part)}
           for p in pkg.glob("*.py")}
    assert own["ome"] <= {"layout"}
    assert not {m for m in imports_of(pkg / "ome.py") if m.startswith(("zfuse.view.array_view", "zfuse.view.tiff"))}
    assert own["layout"] == set()
    assert own["header"] <= {"layout"}
    assert own["tiles"] <= {"layout", "header"}
    assert own["push"] <= {"layout"}
    assert own["file"] <= {"tiles"}  # the reads every whole-image file answers
    assert own["strips"] <= {"layout", "header", "tiles", "file"}  # image.tif: its own header and strip reads
    assert own["slide"] <= {"layout"}  # slide.tif's plan; image.py serves it
    assert own["image"] <= {"layout", "header", "ome", "tiles", "push", "strips", "slide", "file"}
    assert own["__init__"] <= {"image", "layout", "ome", "tiles", "strips"}


def test_whole_image_threads_are_owned_not_module_globals() -> None:
    """The whole-image package starts threads only from objects with an owner (the view's
    `ImageWorkers`): no executor or thread made at import, no `global` rebinding."""
    for path in (PACKAGE / "view" / "whole_image").glob("*.py"):
        tree = ast.parse(path.read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], f"{path.name}: global"
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)] if value is not None else []
            names = {getattr(c.func, "id", getattr(c.func, "attr", "")) for c in calls}
            assert not names & {"ThreadPoolExecutor", "Thread", "ReadAheadAdvisor", "TileDecoders", "ImageWorkers"}, \
                f"{path.name} line {node.lineno}: a module-level executor"


def test_one_ifd_encoder() -> None:
    """view/tiff_ifd.py, a leaf, is the one TIFF IFD encoder: the chunk files' header
    (tiff.py) and the whole-image header use it, and no other module defines the
    classic-TIFF limit or the sample formats."""
    assert not {m for m in imports_of(PACKAGE / "view" / "tiff_ifd.py") if m.startswith("zfuse")}
    users = {module_name(p) for p in PACKAGE.rglob("*.py") if "zfuse.view.tiff_ifd" in imports_of(p)}
    assert {"zfuse.view.tiff", "zfuse.view.whole_image.header"} <= users
    for path in PACKAGE.rglob("*.py"):
        if path.name == "tiff_ifd.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                names = {getattr(t, "id", "") for t in node.targets}
                if not isinstance(node.value, ast.Dict):  # (tiff_complete's _SAMPLE_FORMAT: the tag)
                    names -= {"SAMPLE_FORMAT", "_SAMPLE_FORMAT"}
                assert not names & {"CLASSIC_LIMIT", "_CLASSIC_LIMIT", "SAMPLE_FORMAT", "_SAMPLE_FORMAT"}, \
                    f"{path.name} line {node.lineno} defines {names} (tiff_ifd.py's)"
