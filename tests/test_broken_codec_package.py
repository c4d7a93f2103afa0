"""A codec package that breaks ``import numcodecs`` (and with it zarr) is named as the cause,
not reported as a bare ValueError on every store.

zfpy 1.0.1.post0 does this: numcodecs.zfpy parses ``version("zfpy")`` as integers and
fails on "post0". The failure is reproduced without installing zfpy: a
``zfpy-1.0.1.post0.dist-info`` on PYTHONPATH is all numcodecs looks at. A package that
raises on import (a fake ``pcodec``, which numcodecs imports) stands for the general case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import zarr

from zfuse.view.codec_packages import import_failure


def _run_zfuse(tmp_path: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    zarr.create_group(str(tmp_path / "g.zarr"))
    (tmp_path / "mnt").mkdir()
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-m", "zfuse", "mount", "--foreground", str(tmp_path / "g.zarr"),
                           str(tmp_path / "mnt")], env=env, capture_output=True, text=True, timeout=60)


def test_zfpy_post0_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    dist = fake / "zfpy-1.0.1.post0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zfpy\nVersion: 1.0.1.post0\n")
    run = _run_zfuse(tmp_path, fake)
    assert run.returncode != 0
    assert "numcodecs cannot be imported: ValueError: invalid literal for int()" in run.stderr, run.stderr
    assert "zfpy 1.0.1.post0 is known to break numcodecs: pip uninstall zfpy" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_plugin_raising_on_import_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "pcodec").mkdir(parents=True)
    (fake / "pcodec" / "__init__.py").write_text("raise RuntimeError('built for another CPU')\n")
    run = _run_zfuse(tmp_path, fake)
    assert run.returncode != 0
    assert "numcodecs cannot be imported: RuntimeError: built for another CPU" in run.stderr, run.stderr
    assert "the error comes from pcodec" in run.stderr, run.stderr


def test_other_errors_are_not_blamed_on_codecs() -> None:
    try:
        int("post0")
    except ValueError as exc:
        assert import_failure(exc) is None


def test_an_unknown_codec_id_is_no_broken_package(tmp_path: Path) -> None:
    """A lone v2 array whose compressor id no installed codec has: the mount says that
    codec is not available, not that numcodecs cannot be imported (numcodecs' registry
    refused the id: its frames were taken for an import failing)."""
    (tmp_path / "a.zarr").mkdir()
    (tmp_path / "a.zarr" / ".zarray").write_text(
        '{"zarr_format": 2, "shape": [10, 10], "chunks": [5, 5], "dtype": "<u2", "compressor": {"id": "foo_codec"},'
        ' "fill_value": 0, "filters": null, "order": "C"}')
    (tmp_path / "mnt").mkdir()
    run = subprocess.run([sys.executable, "-m", "zfuse", "mount", str(tmp_path / "a.zarr"), str(tmp_path / "mnt")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "codec 'foo_codec' is not available here" in run.stderr, run.stderr
    assert "cannot be imported" not in run.stderr and "broken codec package" not in run.stderr, run.stderr
