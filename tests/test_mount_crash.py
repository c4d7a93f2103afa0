"""Crash safety: a daemon killed with SIGKILL mid write storm leaves every chunk old or new."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

import stores

pytestmark = pytest.mark.mount

STORM = """
import shutil, sys, itertools
mnt, blobs = sys.argv[1], sys.argv[2:]
for i in itertools.count():
    for j, blob in enumerate(blobs):
        r, c = divmod(j, 2)
        try:
            shutil.copyfile(blob, f"{mnt}/c/{r}/{c}.tiff")
        except OSError:
            sys.exit(0)  # the daemon is gone
"""

KINDS = {
    "v3-zstd": lambda p: stores.v3(p, shape=(32, 32), chunks=(16, 16)),
    "sharding_indexed": lambda p: stores.sharded(p, shape=(32, 32), shards=(32, 32), chunks=(16, 16)),
    "concat-parts": lambda p: stores.concat_parts(p, shape=(32, 32), chunks=(16, 16)),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_sigkill_during_write_storm(tmp_path: Path, mount, kind: str) -> None:
    """[write-10] SIGKILL mid write storm: every chunk old or new."""
    src = tmp_path / "a.zarr"
    old = KINDS[kind](src)
    coords = [(0, 0), (0, 1), (1, 0), (1, 1)]
    new = {c: stores.values((16, 16), "uint16", seed=50 + i) for i, c in enumerate(coords)}
    blobs = []
    for c in coords:
        blobs.append(tmp_path / f"{c[0]}{c[1]}.tif")
        tifffile.imwrite(blobs[-1], new[c])
    rng = random.Random(kind)
    seen_new = 0
    for attempt in range(3):
        m = mount(src, name=f"m{attempt}-")
        storm = subprocess.Popen([sys.executable, "-c", STORM, str(m.path), *map(str, blobs)])
        time.sleep(rng.uniform(0.2, 0.8))
        os.kill(m.proc.pid, signal.SIGKILL)
        storm.wait(timeout=30)
        m.unmount()
        arr = stores.open_any(src)
        for c in coords:
            region = (slice(c[0] * 16, c[0] * 16 + 16), slice(c[1] * 16, c[1] * 16 + 16))
            try:
                got = arr[region]
            except Exception:
                # parts that disagree (data new, checksum old) are detected, never served
                assert kind == "concat-parts", f"{kind}: unreadable chunk {c} after crash"
                continue
            assert (got == old[region]).all() or (got == new[c]).all(), f"{kind}: torn chunk {c}"
            seen_new += bool((got == new[c]).all())
        # a fresh mount serves old-or-new pixels, or EIO for a chunk whose parts disagree
        m2 = mount(src, name=f"check{attempt}-")
        for c in coords:
            region = (slice(c[0] * 16, c[0] * 16 + 16), slice(c[1] * 16, c[1] * 16 + 16))
            f = m2.path / "c" / f"{c[0]}" / f"{c[1]}.tiff"
            try:
                got = tifffile.imread(f)
            except OSError as e:
                assert kind == "concat-parts" and e.errno == 5, e
                continue
            assert (got == old[region]).all() or (got == new[c]).all()
        m2.unmount()
        # no temporary objects are left looking like chunks
        leftovers = [p for p in src.rglob("*") if p.is_file() and p.name.endswith(".tmp")]
        for p in leftovers:
            p.unlink()
        np.testing.assert_equal(len(list(src.rglob("zarr.json"))), 1)
    assert seen_new, "the storm never landed a write before the kill: the test proved nothing"
