"""The README's examples run as written (Python API: concat, save/load)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def python_blocks(containing: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if containing in b]


def test_readme_concat_example_runs_as_written(tmp_path: Path) -> None:
    (block,) = python_blocks("zfuse.concat(")
    assert "zfuse.save_concat(" in block and "zfuse.load_concat(" in block
    r = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ab.json").is_file()


def test_concat_is_a_function_whatever_was_imported() -> None:
    """`zfuse.concat` stays the function even after the implementation module is imported
    (it used to be shadowed by the submodule `zfuse.concat`, or the other way round)."""
    code = ("import zfuse, zfuse.ext.concat as m\n"
            "assert zfuse.concat is m.concat and zfuse.save_concat is m.save_concat\n"
            "assert zfuse.load_concat is m.load_concat and zfuse.ConcatArray is m.ConcatArray\n"
            "import importlib.util\n"
            "assert importlib.util.find_spec('zfuse.concat') is None\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
