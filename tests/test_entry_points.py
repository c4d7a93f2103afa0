"""zarr-python finds ``pad`` and ``suffix`` through the installed entry points alone.

The checks run in fresh interpreters that never import zfuse themselves: zarr must load
``zfuse.ext.pad`` / ``zfuse.ext.suffix`` lazily when it meets the names in metadata.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

# Runs in a subprocess; argv[1] is a scratch directory.
READ_WRITE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import numpy as np
    import zarr

    root = Path(sys.argv[1]) / "arr"
    root.mkdir()
    header = b"HDR!"
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4, 4],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "chunk_key_encoding": {
            "name": "suffix",
            "configuration": {
                "suffix": ".dat",
                "base-encoding": {"name": "v2", "configuration": {"separator": "/"}},
            },
        },
        "codecs": [
            {"name": "bytes"},
            {"name": "pad", "configuration": {"location": "start", "nbytes": 4,
                                              "padding": "SERSIQ=="}},
            {"name": "pad", "configuration": {"location": "end", "nbytes": 2}},
        ],
        "fill_value": 0,
    }
    (root / "zarr.json").write_text(json.dumps(meta))
    (root / "0").mkdir()
    (root / "0" / "1.dat").write_bytes(header + bytes([1, 2, 3, 4]) + b"\\0\\0")

    # zarr is imported but has not loaded the extensions yet: only entry points can.
    assert "zfuse" not in sys.modules, "zfuse imported before zarr needed it"

    arr = zarr.open_array(str(root), mode="r+")
    expected = np.zeros((4, 4), dtype="uint8")
    expected[0:2, 2:4] = [[1, 2], [3, 4]]
    assert (arr[:] == expected).all(), arr[:]
    assert type(arr.metadata.chunk_key_encoding).__module__ == "zfuse.ext.suffix"
    assert [type(c).__module__ for c in arr.metadata.codecs][1:] == ["zfuse.ext.pad"] * 2

    arr[2:4, 0:2] = 9
    raw = (root / "1" / "0.dat").read_bytes()
    assert raw == header + bytes([9, 9, 9, 9]) + b"\\0\\0", raw
    assert (zarr.open_array(str(root))[2:4, 0:2] == 9).all()

    # zarr.json written back by zarr keeps both extensions (underscore spelling).
    arr.attrs["touched"] = True
    cke = json.loads((root / "zarr.json").read_text())["chunk_key_encoding"]
    assert cke["configuration"]["base_encoding"]["name"] == "v2", cke

    # Creating new arrays from plain dicts works the same way.
    new = zarr.create_array(
        str(Path(sys.argv[1]) / "new"), shape=(2,), chunks=(2,), dtype="uint8",
        serializer={"name": "bytes"},
        compressors=[{"name": "pad", "configuration": {"location": "end", "nbytes": 1}}],
        chunk_key_encoding={"name": "suffix", "configuration": {"suffix": ".x"}},
    )
    new[:] = [5, 6]
    assert (Path(sys.argv[1]) / "new" / "c" / "0.x").read_bytes() == bytes([5, 6, 0])
    print("OK")
    """
)


def run_fresh(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd outside the repo, so zfuse can only come from the installed distribution.
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_entry_points_declared() -> None:
    codecs = {e.name: e.value for e in entry_points(group="zarr.codecs")}
    ckes = {e.name: e.value for e in entry_points(group="zarr.chunk_key_encoding")}
    assert codecs.get("pad") == "zfuse.ext.pad:PadCodec"
    assert ckes.get("suffix") == "zfuse.ext.suffix:SuffixChunkKeyEncoding"


def test_script_never_imports_zfuse() -> None:
    assert "import zfuse" not in READ_WRITE_SCRIPT
    assert "from zfuse" not in READ_WRITE_SCRIPT


def test_fresh_interpreter_reads_and_writes_via_entry_points(tmp_path: Path) -> None:
    result = run_fresh(READ_WRITE_SCRIPT, str(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"


def test_fresh_interpreter_registry_lookup_by_name(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from zarr.registry import get_chunk_key_encoding_class, get_codec_class
        assert "zfuse" not in sys.modules
        pad = get_codec_class("pad")
        suffix = get_chunk_key_encoding_class("suffix")
        print(f"{pad.__module__}.{pad.__qualname__}", f"{suffix.__module__}.{suffix.__qualname__}")
        # A later direct import must not create a second registration.
        import importlib
        importlib.import_module("zfuse.ext.pad")
        importlib.import_module("zfuse.ext.suffix")
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # zarr warns when a name has several classes
            assert get_codec_class("pad") is pad
        assert get_chunk_key_encoding_class("suffix") is suffix
        """
    )
    result = run_fresh(script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "zfuse.ext.pad.PadCodec",
        "zfuse.ext.suffix.SuffixChunkKeyEncoding",
    ]


def test_direct_import_first_then_zarr_lookup(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import warnings
        from zfuse.ext.pad import PadCodec
        from zfuse.ext.suffix import SuffixChunkKeyEncoding
        from zarr.registry import get_chunk_key_encoding_class, get_codec_class
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert get_codec_class("pad") is PadCodec
        assert get_chunk_key_encoding_class("suffix") is SuffixChunkKeyEncoding
        print("OK")
        """
    )
    result = run_fresh(script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"
