"""The benchmark stores, built once under benchmarks/data/ (a `.done` marker per store)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from benchmarks.common import DATA, Config, build_once, image


@dataclass(frozen=True)
class Spec:
    """One 2-D uint16 test array."""

    name: str
    shape: tuple[int, int]
    chunks: tuple[int, int]
    shards: tuple[int, int] | None = None
    zstd: bool = True

    @property
    def grid(self) -> tuple[int, int]:
        return (-(-self.shape[0] // self.chunks[0]), -(-self.shape[1] // self.chunks[1]))

    def coords(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.grid[0]) for j in range(self.grid[1])]

    def region(self, i: int, j: int) -> tuple[slice, slice]:
        (ci, cj), (n, m) = self.chunks, self.shape
        return slice(i * ci, min((i + 1) * ci, n)), slice(j * cj, min((j + 1) * cj, m))

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * 2


def read_specs(cfg: Config) -> list[Spec]:
    """The read benchmark's arrays (issue 3): raw, zstd, sharded zstd."""
    n = 2048 if cfg.quick else 4096
    shard = 1024 if cfg.quick else 2048
    return [
        Spec(f"raw{n}", (n, n), (512, 512), zstd=False),
        Spec(f"zstd{n}", (n, n), (512, 512)),
        Spec(f"sharded{n}", (n, n), (512, 512), shards=(shard, shard)),
    ]


def create(store: Path | Any, spec: Spec) -> zarr.Array:
    """An empty array of `spec` at a local path or in a zarr Store."""
    return zarr.create_array(
        store=str(store) if isinstance(store, Path) else store, shape=spec.shape, chunks=spec.chunks, shards=spec.shards,
        dtype="uint16", compressors=[ZstdCodec(level=3)] if spec.zstd else None,
        fill_value=0, zarr_format=3, overwrite=True,
    )


def build(cfg: Config, spec: Spec, seed: int = 0, tag: str = "") -> Path:
    """The store of `spec` filled with `image(seed)`."""
    path = DATA / f"{spec.name}{tag}.zarr"

    def make(p: Path) -> None:
        arr = create(p, spec)
        arr[...] = image(spec.shape, seed)

    return build_once(path, make, cfg, f"{spec.name} ({spec.shape}, chunks {spec.chunks}, shards {spec.shards})")


def chunk_paths(root: Path | str, coords: list[tuple[int, ...]]) -> list[str]:
    """Chunk file paths of an array shown at `root` (default `c/i/j` keys)."""
    return [os.path.join(str(root), "c", *map(str, c[:-1]), f"{c[-1]}.tiff") for c in coords]


def read_block(arr: zarr.Array, spec: Spec, i: int, j: int) -> np.ndarray:
    """zarr-python in-process read of one (inner) chunk.

    `blocks` indexes shards in zarr 3.1 for sharded arrays, so those use the
    inner chunk's region.
    """
    if spec.shards is None:
        return arr.blocks[i, j]
    return arr[spec.region(i, j)]
