"""Every option's default lives in zfuse/defaults.py: the daemon's config, the view's
options, the write path, the store layer and the help text all agree with it."""

from __future__ import annotations

import ast
from pathlib import Path

from zfuse import defaults
from zfuse.daemon import MountConfig
from zfuse.mount_options import options_help
from zfuse.store import DEFAULT_REMOTE_TIMEOUT
from zfuse.view.array_view import ViewOptions
from zfuse.view.writes import PENDING_TIMEOUT, REPLACE_WINDOW


def test_one_source_of_defaults() -> None:
    config = MountConfig(sources=["x"], mountpoint="/m")
    view = ViewOptions()
    assert config.cache_bytes == view.cache_bytes == defaults.CACHE_BYTES
    assert config.listing_cache_names == view.listing_cache_names == defaults.LISTING_CACHE_NAMES
    assert config.index_cache_bytes == view.shard_index_cache_bytes == defaults.INDEX_CACHE_BYTES
    assert config.max_threads == defaults.THREADS and config.read_ahead_kb == defaults.READ_AHEAD_KB
    assert (REPLACE_WINDOW, PENDING_TIMEOUT) == (defaults.REPLACE_WINDOW, defaults.PENDING_TIMEOUT)
    assert DEFAULT_REMOTE_TIMEOUT == defaults.REMOTE_TIMEOUT
    import inspect

    from zfuse.view.writes import Writes

    assert inspect.signature(Writes).parameters["buffer_budget"].default == defaults.WRITE_BUFFERS
    text = options_help()
    for shown in (f"default {defaults.CACHE_BYTES // 2**20}M", f"default {defaults.THREADS})",
                  f"default {defaults.PENDING_TIMEOUT:g})", f"default {defaults.REMOTE_TIMEOUT:g} for remote"):
        assert shown in " ".join(text.split()), shown


def test_defaults_import_nothing() -> None:
    """The CLI reads it before numpy or zarr are loaded."""
    tree = ast.parse(Path(defaults.__file__).read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)
