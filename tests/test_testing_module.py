"""zfuse.testing serves tests and benchmarks: the daemon never loads it, and it never loads pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _loaded_after(imports: str) -> set[str]:
    """The modules a fresh interpreter has loaded after `imports`."""
    code = f"import sys\n{imports}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_zfuse_testing_does_not_import_pytest() -> None:
    loaded = _loaded_after("import zfuse.testing")
    assert "zfuse.testing" in loaded
    assert not {m for m in loaded if m == "pytest" or m.startswith(("_pytest", "pytest."))}


@pytest.mark.parametrize("module", ["zfuse.cli", "zfuse.daemon"])
def test_the_daemon_and_cli_do_not_import_zfuse_testing(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    assert module in loaded
    assert "zfuse.testing" not in loaded


def test_benchmarks_do_not_import_the_tests() -> None:
    """benchmarks/ take shared helpers from zfuse.testing, never from tests/."""
    for path in (ROOT / "benchmarks").glob("*.py"):
        text = path.read_text()
        assert '"tests"' not in text and "from tools import" not in text and "from readers import" not in text, path
    loaded = _loaded_after("import benchmarks.run")
    assert not {"conftest", "tools", "readers", "stores"} & loaded
