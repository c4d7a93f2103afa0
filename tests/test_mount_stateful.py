"""Random sequences of file operations on the mount agree with an in-memory model.

The model is a dict of chunk values (None: no chunk) plus scratch files. After
every step every chunk file and scratch file on the mount is compared with it,
and at the end of each run the store itself (read with zfuse.open_array).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import stores

pytestmark = pytest.mark.mount

SHAPE, CHUNKS = (16, 32), (8, 16)
COORDS = [(0, 0), (0, 1), (1, 0), (1, 1)]
KINDS = {
    "v3-zstd": lambda p: stores.v3(p, shape=SHAPE, chunks=CHUNKS),
    "sharding_indexed": lambda p: stores.sharded(p, shape=SHAPE, shards=(16, 32), chunks=CHUNKS),
    "stacked": lambda p: stores.stacked(p, shape=SHAPE, chunks=CHUNKS),
}
coords_st = st.sampled_from(COORDS)
scratch_st = st.sampled_from([".0.tiff.tmp", "save~", "x.part"])


def make_machine(m: Any, src: Path, blobs: Path) -> type[RuleBasedStateMachine]:
    mnt = m.path

    def chunk_file(c: tuple[int, int]) -> Path:
        return mnt / "c" / str(c[0]) / f"{c[1]}.tiff"

    def tiff_of(values: np.ndarray, tag: str) -> Path:
        path = blobs / f"{tag}.tif"
        tifffile.imwrite(path, values)
        return path

    class MountModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.chunks: dict[tuple[int, int], np.ndarray | None] = {}
            # unlinked, still in the store for the (long) replace window: a refused
            # replacement brings these values back
            self.removed: dict[tuple[int, int], np.ndarray] = {}
            self.scratch: dict[str, bytes] = {}
            self.step = 0
            # reset the mount to a known state, through the mount itself
            for name in os.listdir(mnt / "c" / "0"):
                if not name.endswith(".tiff") or name.startswith("."):
                    (mnt / "c" / "0" / name).unlink()
            for c in COORDS:
                values = stores.values(CHUNKS, "uint16", seed=c[0] * 2 + c[1])
                shutil.copyfile(tiff_of(values, "init"), chunk_file(c))
                self.chunks[c] = values
            self.removed.clear()

        @rule(c=coords_st, seed=st.integers(0, 10_000))
        def write_whole_file(self, c: tuple[int, int], seed: int) -> None:
            values = stores.values(CHUNKS, "uint16", seed=seed)
            shutil.copyfile(tiff_of(values, "whole"), chunk_file(c))
            self.chunks[c] = values
            self.removed.pop(c, None)

        @rule(c=coords_st, pixel=st.integers(0, CHUNKS[0] * CHUNKS[1] - 1), value=st.integers(1, 65535))
        def patch_pixel_in_place(self, c: tuple[int, int], pixel: int, value: int) -> None:
            current = self.chunks[c]
            if current is None:
                with pytest.raises(FileNotFoundError):
                    open(chunk_file(c), "r+b")
                return
            size = chunk_file(c).stat().st_size
            with open(chunk_file(c), "r+b") as f:
                f.seek(size - current.nbytes + 2 * pixel)
                f.write(np.array([value], "<u2").tobytes())
            updated = current.copy()
            updated.flat[pixel] = value
            self.chunks[c] = updated

        @rule(c=coords_st)
        def truncate_to_nothing_fails(self, c: tuple[int, int]) -> None:
            if self.chunks[c] is None:
                return
            with pytest.raises(OSError) as e:
                os.truncate(chunk_file(c), 0)
            assert e.value.errno == errno.EINVAL

        @rule(c=coords_st)
        def unlink(self, c: tuple[int, int]) -> None:
            if self.chunks[c] is None:
                with pytest.raises(FileNotFoundError):
                    chunk_file(c).unlink()
            else:
                chunk_file(c).unlink()
                self.removed[c] = self.chunks[c]
                self.chunks[c] = None

        @rule(c=coords_st, seed=st.integers(0, 10_000), good=st.booleans())
        def unlink_then_create(self, c: tuple[int, int], seed: int, good: bool) -> None:
            """mv from another filesystem: unlink, create, copy; a refused file costs nothing."""
            if self.chunks[c] is not None:
                chunk_file(c).unlink()
                self.removed[c] = self.chunks[c]
                self.chunks[c] = None
            values = stores.values(CHUNKS, "uint16" if good else "float32", seed=seed)
            if good:
                shutil.copyfile(tiff_of(values, "replacement"), chunk_file(c))
                self.chunks[c] = values
                self.removed.pop(c, None)
            else:
                with pytest.raises(OSError) as e:
                    shutil.copyfile(tiff_of(values, "refused"), chunk_file(c))
                assert e.value.errno == errno.EINVAL
                # the unlinked chunk is back; a chunk that did not exist stays absent
                if c in self.removed:
                    self.chunks[c] = self.removed.pop(c)

        @rule(c=coords_st, seed=st.integers(0, 10_000), cut=st.integers(1, 200))
        def close_incomplete_then_reopen(self, c: tuple[int, int], seed: int, cut: int) -> None:
            """Bio-Formats' pattern: the beginning of the file, close, reopen, finish, close."""
            values = stores.values(CHUNKS, "uint16", seed=seed)
            data = tiff_of(values, "pieces").read_bytes()
            cut = min(cut, len(data) - 1)
            with open(chunk_file(c), "wb") as f:
                f.write(data[:cut])
            with open(chunk_file(c), "r+b") as f:
                f.seek(cut)
                f.write(data[cut:])
            self.chunks[c] = values
            self.removed.pop(c, None)

        @rule(name=scratch_st, seed=st.integers(0, 10_000))
        def write_scratch(self, name: str, seed: int) -> None:
            values = stores.values(CHUNKS, "uint16", seed=seed)
            data = tiff_of(values, "scratch").read_bytes()
            (mnt / "c" / "0" / name).write_bytes(data)
            self.scratch[name] = data

        @rule(name=scratch_st, c=coords_st)
        def rename_scratch_onto_chunk(self, name: str, c: tuple[int, int]) -> None:
            if name not in self.scratch:
                return
            target = chunk_file(c)
            os.rename(mnt / "c" / "0" / name, target)
            data = self.scratch.pop(name)
            self.chunks[c] = tifffile.imread(_bytes_file(blobs, data))
            self.removed.pop(c, None)

        @rule(a=coords_st, b=coords_st)
        def rename_chunk(self, a: tuple[int, int], b: tuple[int, int]) -> None:
            if self.chunks[a] is None or a == b:
                return
            os.rename(chunk_file(a), chunk_file(b))
            self.chunks[b], self.chunks[a] = self.chunks[a], None
            self.removed.pop(b, None)  # a is deleted at once by a rename, not deferred

        @invariant()
        def mount_matches_model(self) -> None:
            for c, values in self.chunks.items():
                if values is None:
                    assert not chunk_file(c).exists(), c
                else:
                    np.testing.assert_array_equal(tifffile.imread(chunk_file(c)), values, err_msg=str(c))
            for name, data in self.scratch.items():
                assert (mnt / "c" / "0" / name).read_bytes() == data

        def teardown(self) -> None:
            arr = stores.open_any(src)
            for c, values in self.chunks.items():
                region = (slice(c[0] * 8, c[0] * 8 + 8), slice(c[1] * 16, c[1] * 16 + 16))
                # an unlinked chunk stays in the store until the replace window closes
                expect = self.removed.get(c, np.zeros(CHUNKS, "uint16")) if values is None else values
                np.testing.assert_array_equal(arr[region], expect, err_msg=f"store {c}")

    return MountModel


def _bytes_file(folder: Path, data: bytes) -> Path:
    path = folder / "renamed.tif"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", list(KINDS))
def test_random_operations_match_the_model(tmp_path: Path, mount, kind: str) -> None:
    """[cons-1] [ns-1] [ns-2] [ns-3] [ns-4] [write-2] random operation sequences agree with a model."""
    src = tmp_path / "a.zarr"
    KINDS[kind](src)
    m = mount(src, "-o", "replace_window=600")  # deterministic: no deletion during an example
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    machine = make_machine(m, src, blobs)
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=12, stateful_step_count=12, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )
