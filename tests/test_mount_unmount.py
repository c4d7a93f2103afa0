"""Stopping the daemon on a real mount: a busy unmount fails clearly, SIGTERM commits open files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from zfuse.testing import assert_no_traceback, tiff_bytes

import stores

pytestmark = pytest.mark.mount


def test_umount_busy_then_sigterm_commits(tmp_path: Path, mount) -> None:
    """[cons-3] `zfuse umount` with a file open fails with a clear message and leaves the
    mount working; SIGTERM then commits the open file that parses and unmounts."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    p = m.path / "c" / "1" / "0.tiff"
    new = np.full((8, 16), 5, "u2")
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, tiff_bytes(new))
    try:
        r = subprocess.run([sys.executable, "-m", "zfuse.cli", "umount", str(m.path)], capture_output=True, text=True)
        assert r.returncode == 1 and "busy" in r.stderr
        assert os.path.ismount(m.path)
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(timeout=20) == 0
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    np.testing.assert_array_equal(zarr.open_array(str(src))[8:16, 0:16], new)
    assert "SIGTERM" in m.log()
    assert_no_traceback(m)
