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
