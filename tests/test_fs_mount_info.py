"""`.zfuse/mount` in the filesystem layer, by plain calls (no kernel): present only
when the daemon provides it, JSON whose stat size is its read size, read-only."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from zfuse.fs import FsError

import stores
from test_fs import Clock, make_fs


def test_mount_file_is_what_the_daemon_says(tmp_path: Path) -> None:
    """[tree-6] .zfuse/mount: listed and readable once the daemon gives mount_info."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    fs, k = make_fs(src, Clock())
    assert "mount" not in k.listdir(".zfuse")  # no daemon, no such file
    assert not k.exists(".zfuse/mount")
    state = {"pid": 1234, "sources": [str(src)], "reloads": 0}
    fs.special.mount_info = lambda: dict(state)  # (the daemon passes it to FileSystem)
    assert sorted(k.listdir(".zfuse")) == ["errors", "mount", "stats"]
    size = k.stat(".zfuse/mount").size
    content = k.read_file(".zfuse/mount")
    assert len(content) == size and json.loads(content) == state
    state["reloads"] = 12345  # content changes: size and read still agree
    assert len(k.read_file(".zfuse/mount")) == k.stat(".zfuse/mount").size
    assert json.loads(k.read_file(".zfuse/mount"))["reloads"] == 12345
    with pytest.raises(FsError) as e:
        k.open(".zfuse/mount", os.O_WRONLY)
    assert e.value.errno == errno.EACCES
