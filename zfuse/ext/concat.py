"""Virtual concatenation: several zarr arrays seen as one, nothing copied.

``concat(sources, axis)`` returns a :class:`ConcatArray` that behaves like
``numpy.concatenate([s[...] for s in sources], axis)`` for reading and routes
writes back to the source arrays.  A concatenation can be saved as a small JSON
description file (:func:`save_concat` / :func:`load_concat`).

Invariants
----------
- Sources agree on dtype (byte order aside), rank and the extent of every axis
  other than ``axis``; anything else raises :class:`SourceMismatchError` naming
  the source (index and name) and what differs.  Chunk shapes, codecs, shards
  and storage transformers may differ.
- Source ``i`` occupies ``[offsets[i], offsets[i] + sources[i].shape[axis])``
  along ``axis``; the intervals tile ``[0, shape[axis])`` in order.  Length-0
  sources are allowed and occupy nothing.
- Every read and write goes through zarr-python indexing of a source
  (``src[region]`` / ``src[region] = value``), so every codec, sharding and
  storage transformer the source was opened with applies.  The only direct
  store access is ``chunk_exists`` (key lookup) and ``delete_chunk`` (key
  deletion for whole, unsharded, untransformed source chunks).
- Boundaries need not be chunk-aligned: a view chunk straddling sources is
  assembled from all of them on read and split between them on write; there is
  no masked padding inside the array.
- Opened read-only unless asked otherwise (``mode="r"``, like
  ``zfuse.open_array``; ``zarr.open_array``'s default ``"a"`` would create
  missing sources, which a concatenation must never do).  Writing to a
  read-only concatenation raises :class:`ReadOnlyArrayError` saying to open it
  with ``mode="r+"``.
- The view's chunk grid is the first source's ``chunks`` (for a sharded source
  that is the *inner* chunk shape, as zarr-python 3.1 reports it).  Edge chunks
  of the view are handled like zarr's: ``read_chunk`` returns the full chunk
  shape with the out-of-bounds part set to the view's fill value (the first
  source's), and ``write_chunk`` writes only the in-bounds part.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from zfuse.errors import ArgumentError, MetadataError, ReadOnlyArrayError, SourceMismatchError
from zfuse.ext.metadata_json import MAX_METADATA_DEPTH, nesting_depth

__all__ = [
    "ConcatArray",
    "concat",
    "describe",
    "is_concat_description",
    "load_concat",
    "save_concat",
]

#: key and version of the JSON description format
DESCRIPTION_KEY = "zfuse_concat"
DESCRIPTION_VERSION = 1
# Description files are tiny; refuse to parse anything big when sniffing.
_MAX_DESCRIPTION_BYTES = 1 << 20

Region = tuple[slice, ...]


def _open(src: Any, mode: str, **kwargs: Any) -> zarr.Array:
    """Open a path/URL/Store as a zarr array, preferring zfuse's opener
    (which knows zfuse's storage transformers) over plain zarr."""
    try:
        from zfuse.ext.api import open_array
    except ImportError:
        return zarr.open_array(store=src, mode=mode, **kwargs)
    return open_array(src, mode=mode, **kwargs)


def _source_name(src: Any, given: Any) -> str:
    if isinstance(given, (str, os.PathLike)):
        return os.fspath(given)
    try:
        return str(src.store_path)
    except AttributeError:
        return repr(given)


def _is_url(s: str) -> bool:
    return "://" in s


def _fill_of(src: zarr.Array) -> Any:
    # zarr v2 arrays may have fill_value None; zarr then reads zeros.
    fv = src.fill_value
    return 0 if fv is None else fv


class _BlockIndex:
    """``ca.blocks[...]``: indexing in the view's chunk grid (like zarr's)."""

    def __init__(self, array: ConcatArray) -> None:
        self._array = array

    def _region(self, key: Any) -> Region:
        ca = self._array
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (ca.ndim - len(key) + 1) + key[i + 1 :]
        if len(key) > ca.ndim:
            raise IndexError(f"too many block indices: {len(key)} for {ca.ndim} dimensions")
        key = key + (slice(None),) * (ca.ndim - len(key))
        out = []
        for d, (k, n, c, g) in enumerate(
            zip(key, ca.shape, ca.chunks, ca.cdata_shape, strict=True)
        ):
            if isinstance(k, slice):
                start, stop, step = k.indices(g)
                if step != 1:
                    raise IndexError("block slices must have step 1")
                stop = max(start, stop)
            else:
                try:
                    i = operator.index(k)
                except TypeError:
                    raise IndexError(f"unsupported block index {k!r}") from None
                if not -g <= i < g:
                    raise IndexError(
                        f"block index {i} out of range for {g} blocks in dimension {d}"
                    )
                start = i % g
                stop = start + 1
            out.append(slice(min(start * c, n), min(stop * c, n)))
        return tuple(out)

    def __getitem__(self, key: Any) -> np.ndarray:
        return self._array[self._region(key)]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._array[self._region(key)] = value


class ConcatArray:
    """Several zarr arrays concatenated along ``axis``; see the module docstring."""

    def __init__(self, sources: Sequence[zarr.Array], names: Sequence[str], axis: int) -> None:
        # Use concat(); this constructor trusts that the sources were validated.
        self.sources: tuple[zarr.Array, ...] = tuple(sources)
        self.names: tuple[str, ...] = tuple(names)
        self.axis: int = axis
        first = self.sources[0]
        # native byte order: sources may differ in it and values are compared, not bytes
        self.dtype: np.dtype = np.dtype(first.dtype).newbyteorder("=")
        self.chunks: tuple[int, ...] = tuple(int(c) for c in first.chunks)
        self.fill_value: Any = _fill_of(first)
        lengths = [int(s.shape[axis]) for s in self.sources]
        self.lengths: tuple[int, ...] = tuple(lengths)
        self.offsets: tuple[int, ...] = tuple(int(o) for o in np.cumsum([0, *lengths[:-1]]))
        shape = list(first.shape)
        shape[axis] = sum(lengths)
        self.shape: tuple[int, ...] = tuple(int(n) for n in shape)

    def sources_between(self, lo: int, hi: int) -> range:
        """The indexes of the sources that may overlap [lo, hi) along the axis: found by
        bisection over the offsets (a description may name 100,000 sources: a loop over
        them all cost 66 ms per chunk read)."""
        first = max(bisect.bisect_right(self.offsets, lo) - 1, 0)
        return range(first, bisect.bisect_left(self.offsets, hi, lo=first))

    # ------------------------------------------------------------------ basics
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def cdata_shape(self) -> tuple[int, ...]:
        """Number of view chunks along each dimension."""
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunks, strict=True))

    @property
    def blocks(self) -> _BlockIndex:
        return _BlockIndex(self)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"<ConcatArray shape={self.shape} dtype={self.dtype} chunks={self.chunks} "
            f"axis={self.axis} sources={list(self.names)}>"
        )

    @property
    def read_only(self) -> bool:
        """True if any source was opened read-only (then nothing can be written)."""
        return any(src.read_only for src in self.sources)

    def _check_writable(self) -> None:
        read_only = [f"source {i} ({name})" for i, (src, name) in
                     enumerate(zip(self.sources, self.names, strict=True)) if src.read_only]
        if read_only:
            raise ReadOnlyArrayError(
                f"this concatenation is read-only ({', '.join(read_only)} opened with mode 'r'); "
                "to write, open it with mode=\"r+\": zfuse.concat(sources, axis, mode=\"r+\") "
                "or zfuse.load_concat(path, mode=\"r+\")")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype)

    # ---------------------------------------------------------------- indexing
    def _parse(self, key: Any) -> tuple[list[tuple[int, int, int, bool, bool]], list[int]]:
        """Normalise a basic-indexing key.

        Returns per-dimension ``(start, count, step, flip, drop)`` with a
        positive ``step`` (zarr does not read negative steps: a negative-step
        slice is read forwards and flipped), and the positions of ``None``
        (newaxis) in the result.
        """
        if not isinstance(key, tuple):
            key = (key,)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(
                f"too many indices for array: array is {self.ndim}-dimensional, "
                f"but {n_real} were indexed"
            )
        if n_ell:
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - n_real) + key[i + 1 :]
        else:
            key = key + (slice(None),) * (self.ndim - n_real)
        dims: list[tuple[int, int, int, bool, bool]] = []
        newaxes: list[int] = []
        out_pos = 0
        for k in key:
            if k is None:
                newaxes.append(out_pos)
                out_pos += 1
                continue
            n = self.shape[len(dims)]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                count = len(range(start, stop, step))
                if step < 0 and count:
                    # read [last, ..., start] forwards, flip afterwards
                    dims.append((start + (count - 1) * step, count, -step, True, False))
                else:
                    dims.append((start if count else 0, count, abs(step), False, False))
                out_pos += 1
                continue
            if isinstance(k, (bool, np.bool_)):
                raise IndexError("boolean indices are not supported (basic indexing only)")
            try:
                i = operator.index(k)
            except TypeError:
                raise IndexError(
                    f"unsupported index {k!r}: only integers, slices, Ellipsis and None"
                ) from None
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {len(dims)} with size {n}")
            dims.append((i % n, 1, 1, False, True))
        return dims, newaxes

    def _pieces(
        self, dims: list[tuple[int, int, int, bool, bool]]
    ) -> Iterator[tuple[int, tuple[slice, ...], tuple[slice, ...]]]:
        """For a parsed selection, yield ``(source_index, source_selection,
        out_selection)`` where ``out_selection`` indexes the forward-order,
        full-rank result block."""
        if any(count == 0 for _, count, _, _, _ in dims):
            return
        base_src = []
        base_out = []
        for start, count, step, _, _ in dims:
            base_src.append(slice(start, start + (count - 1) * step + 1, step))
            base_out.append(slice(0, count))
        start, count, step, _, _ = dims[self.axis]
        for i in self.sources_between(start, start + (count - 1) * step + 1):
            off, length = self.offsets[i], self.lengths[i]
            if length == 0:
                continue
            # result positions k with off <= start + k*step < off + length
            k0 = max(0, -(-(off - start) // step))
            k1 = min(count, -(-(off + length - start) // step))
            if k0 >= k1:
                continue
            first = start + k0 * step - off
            last = start + (k1 - 1) * step - off
            src_sel = list(base_src)
            src_sel[self.axis] = slice(first, last + 1, step)
            out_sel = list(base_out)
            out_sel[self.axis] = slice(k0, k1)
            yield i, tuple(src_sel), tuple(out_sel)

    def __getitem__(self, key: Any) -> Any:
        dims, newaxes = self._parse(key)
        shape = tuple(d[1] for d in dims)
        pieces = list(self._pieces(dims))
        if len(pieces) == 1 and pieces[0][2][self.axis] == slice(0, shape[self.axis]):
            # the common case (selection within one source): no assembly copy
            i, src_sel, _ = pieces[0]
            block = np.asarray(self.sources[i][src_sel], dtype=self.dtype)
        else:
            block = np.empty(shape, dtype=self.dtype)
            for i, src_sel, out_sel in pieces:
                block[out_sel] = self.sources[i][src_sel]
        view = block[tuple(slice(None, None, -1) if d[3] else slice(None) for d in dims)]
        view = view[tuple(0 if d[4] else slice(None) for d in dims)]
        for pos in newaxes:
            view = np.expand_dims(view, pos)
        # a 0-d result becomes a numpy scalar, as numpy does for all-integer keys
        return np.ascontiguousarray(view) if view.ndim else view[()]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check_writable()
        dims, newaxes = self._parse(key)
        sel_shape = [d[1] for d in dims if not d[4]]
        for pos in newaxes:
            sel_shape.insert(pos, 1)
        value = np.asarray(value, dtype=self.dtype)
        # numpy drops leading length-1 dimensions of the value when they are surplus
        while value.ndim > len(sel_shape) and value.shape[0] == 1:
            value = value[0]
        value = np.broadcast_to(value, tuple(sel_shape))
        # undo newaxis, integer indices and flips to get the forward-order full-rank block
        if newaxes:
            value = value[tuple(0 if p in newaxes else slice(None) for p in range(value.ndim))]
        for d, dim in enumerate(dims):
            if dim[4]:
                value = np.expand_dims(value, d)
        value = value[tuple(slice(None, None, -1) if d[3] else slice(None) for d in dims)]
        for i, src_sel, out_sel in self._pieces(dims):
            self.sources[i][src_sel] = value[out_sel]

    # ------------------------------------------------------------ chunk level
    def _check_chunk_coords(self, coords: Sequence[int]) -> tuple[int, ...]:
        coords = tuple(operator.index(c) for c in coords)
        grid = self.cdata_shape
        if len(coords) != self.ndim or not all(
            0 <= c < g for c, g in zip(coords, grid, strict=True)
        ):
            raise IndexError(f"chunk coordinates {coords} outside the chunk grid {grid}")
        return coords

    def chunk_region(self, coords: Sequence[int]) -> Region:
        """The view region (clipped to the array bounds) of view chunk ``coords``."""
        coords = self._check_chunk_coords(coords)
        return tuple(
            slice(c * s, min((c + 1) * s, n))
            for c, s, n in zip(coords, self.chunks, self.shape, strict=True)
        )

    def chunk_sources(self, chunk_coords: Sequence[int]) -> list[tuple[int, Region, Region]]:
        """Which sources view chunk ``chunk_coords`` overlaps.

        Returns ``(source_index, source_region, view_region)`` per overlapping
        source, in order along the axis; ``source_region`` is in the source's
        coordinates and ``view_region`` in the view's (absolute, clipped to
        the array bounds).  More than one entry means the chunk straddles a
        source boundary.
        """
        region = self.chunk_region(chunk_coords)
        lo, hi = region[self.axis].start, region[self.axis].stop
        out = []
        for i in self.sources_between(lo, hi):
            off, length = self.offsets[i], self.lengths[i]
            a, b = max(lo, off), min(hi, off + length)
            if a >= b:
                continue
            view_region = list(region)
            view_region[self.axis] = slice(a, b)
            src_region = list(region)
            src_region[self.axis] = slice(a - off, b - off)
            out.append((i, tuple(src_region), tuple(view_region)))
        return out

    def _straddling_axis_chunks(self) -> list[int]:
        c = self.chunks[self.axis]
        n = self.shape[self.axis]
        # interior boundaries that are not on the view's chunk grid
        bounds = {o for o in self.offsets[1:] if 0 < o < n and o % c}
        return sorted({b // c for b in bounds})

    def straddling_chunks(self) -> Iterator[tuple[int, ...]]:
        """View chunk coordinates (row-major order) that cross a source boundary."""
        axis_chunks = self._straddling_axis_chunks()
        if not axis_chunks:
            return
        ranges: list[Sequence[int]] = [range(g) for g in self.cdata_shape]
        ranges[self.axis] = axis_chunks
        yield from itertools.product(*ranges)

    def count_straddling_chunks(self) -> int:
        grid = list(self.cdata_shape)
        grid[self.axis] = len(self._straddling_axis_chunks())
        return math.prod(grid)

    def read_chunk(self, coords: Sequence[int]) -> np.ndarray:
        """View chunk ``coords`` at full chunk shape; the part beyond the array
        bounds is the view's fill value (as zarr stores edge chunks)."""
        region = self.chunk_region(coords)
        full = all(r.stop - r.start == c for r, c in zip(region, self.chunks, strict=True))
        if full:
            return np.ascontiguousarray(self[region])
        out = np.full(self.chunks, self.fill_value, dtype=self.dtype)
        out[tuple(slice(0, r.stop - r.start) for r in region)] = self[region]
        return out

    def write_chunk(self, coords: Sequence[int], data: Any) -> None:
        """Write view chunk ``coords`` from ``data`` of the full chunk shape;
        only the in-bounds part reaches the sources."""
        self._check_writable()
        region = self.chunk_region(coords)
        data = np.asarray(data, dtype=self.dtype)
        if data.shape != self.chunks:
            raise ArgumentError(f"chunk data has shape {data.shape}, expected {self.chunks}")
        self[region] = data[tuple(slice(0, r.stop - r.start) for r in region)]

    @staticmethod
    def _storage_grid(src: zarr.Array) -> tuple[int, ...]:
        # the unit that has its own store key: the shard if sharded, else the chunk
        return tuple(src.shards or src.chunks)

    @staticmethod
    def _storage_chunks(src: zarr.Array, region: Region) -> Iterator[tuple[tuple[int, ...], bool]]:
        """Store-level chunks of ``src`` overlapping ``region``, each with
        whether ``region`` covers all of its in-bounds part."""
        grid = ConcatArray._storage_grid(src)
        per_dim = []
        for r, c, n in zip(region, grid, src.shape, strict=True):
            cs = []
            for k in range(r.start // c, -(-r.stop // c)):
                a, b = k * c, min((k + 1) * c, n)
                cs.append((k, r.start <= a and b <= r.stop))
            per_dim.append(cs)
        for combo in itertools.product(*per_dim):
            yield tuple(k for k, _ in combo), all(w for _, w in combo)

    @staticmethod
    def _key_path(src: zarr.Array, coords: tuple[int, ...]) -> Any:
        return src.store_path / src.metadata.encode_chunk_key(coords)

    def chunk_exists(self, coords: Sequence[int]) -> bool:
        """True if any stored source chunk overlapping view chunk ``coords``
        exists in its store.

        For a sharded source the unit looked up is the shard: an existing shard
        counts even if the inner chunks in question are empty (reading the shard
        index would be needed to tell, and an over-report only costs a read of
        fill values).
        """
        from zarr.core.sync import sync

        for i, src_region, _ in self.chunk_sources(coords):
            src = self.sources[i]
            for key_coords, _ in self._storage_chunks(src, src_region):
                if sync(self._key_path(src, key_coords).exists()):
                    return True
        return False

    def delete_chunk(self, coords: Sequence[int]) -> None:
        """Reset view chunk ``coords`` to the sources' fill values.

        Source chunks wholly inside the chunk are deleted from the store (for
        unsharded sources without storage transformers, where a chunk is
        exactly one key); the rest is overwritten with the source's fill value
        through zarr indexing (zarr itself drops chunks that become all-fill
        unless the source was opened with ``write_empty_chunks=True``).
        """
        self._check_writable()
        from zarr.core.sync import sync

        for i, src_region, _ in self.chunk_sources(coords):
            src = self.sources[i]
            fill = _fill_of(src)
            if src.shards is not None or getattr(src.metadata, "storage_transformers", ()):
                src[src_region] = fill
                continue
            grid = self._storage_grid(src)
            for key_coords, whole in self._storage_chunks(src, src_region):
                if whole:
                    sync(self._key_path(src, key_coords).delete())
                    continue
                sub = tuple(
                    slice(max(r.start, k * c), min(r.stop, (k + 1) * c))
                    for r, k, c in zip(src_region, key_coords, grid, strict=True)
                )
                src[sub] = fill


def concat(
    sources: Sequence[Any],
    axis: int,
    *,
    mode: str = "r",
    names: Sequence[str] | None = None,
    **open_kwargs: Any,
) -> ConcatArray:
    """Concatenate ``sources`` along ``axis`` without copying.

    ``sources`` are ``zarr.Array`` objects (used as they were opened) or
    anything ``zfuse.open_array`` opens (paths, URLs, Stores), opened with
    ``mode`` and ``open_kwargs`` (e.g. ``storage_options``).  ``mode`` is
    ``"r"`` (read-only) by default, as for ``zfuse.open_array``; use ``"r+"``
    to write.  Sources must exist: no mode creates them.  ``names`` overrides how
    sources are named in messages and ``describe`` (default: the given path,
    or the array's store path).
    Raises :class:`SourceMismatchError` if there are no sources, ``axis`` is
    out of range, or the sources disagree on dtype, rank or the extent of an
    axis other than ``axis``.
    """
    sources = list(sources)
    if not sources:
        raise SourceMismatchError("concat needs at least one source array")
    if names is not None and len(names) != len(sources):
        raise ArgumentError(f"{len(names)} names given for {len(sources)} sources")
    arrays: list[zarr.Array] = []
    labels: list[str] = []
    # a source named again is the array opened before (a description file may list one
    # source thousands of times: one open, not one each)
    opened: dict[Any, zarr.Array] = {}  # by path, or by the Store object given
    for i, given in enumerate(sources):
        if isinstance(given, zarr.Array):
            arr = given
        else:
            try:
                target = os.fspath(given) if isinstance(given, os.PathLike) else given
                key = target if isinstance(target, str) else id(target)
                arr = opened.get(key)
                if arr is None:
                    arr = opened[key] = _open(target, mode, **open_kwargs)
            except Exception as e:
                e.add_note(f"while opening concat source {i} ({_source_name(None, given)})")
                raise
        arrays.append(arr)
        labels.append(names[i] if names is not None else _source_name(arr, given))
    axis = _validate(arrays, labels, axis)
    return ConcatArray(arrays, labels, axis)


def _validate(arrays: Sequence[zarr.Array], names: Sequence[str], axis: int) -> int:
    """Check that the arrays can be concatenated along ``axis``; return the
    normalised (non-negative) axis."""
    first = arrays[0]
    ndim = len(first.shape)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise SourceMismatchError(f"axis must be an integer, not {axis!r}")
    if not -ndim <= axis < ndim:
        raise SourceMismatchError(
            f"axis {axis} is out of range for arrays of rank {ndim} "
            f"(source 0 ({names[0]}) has shape {tuple(first.shape)})"
        )
    axis = int(axis) % ndim
    dt0 = np.dtype(first.dtype)
    problems = []
    for i, (arr, name) in enumerate(zip(arrays, names, strict=True)):
        if i == 0:
            continue
        who = f"source {i} ({name})"
        shape = tuple(arr.shape)
        if len(shape) != ndim:
            problems.append(
                f"{who}: rank {len(shape)} (shape {shape}) differs from source 0's "
                f"rank {ndim} (shape {tuple(first.shape)})"
            )
            continue
        dt = np.dtype(arr.dtype)
        # byte order is a storage detail: values read back identically
        if dt.newbyteorder("=") != dt0.newbyteorder("="):
            problems.append(f"{who}: dtype {dt} differs from source 0's {dt0}")
        for d in range(ndim):
            if d != axis and shape[d] != first.shape[d]:
                problems.append(
                    f"{who}: extent {shape[d]} along axis {d} differs from source 0's "
                    f"{first.shape[d]} (shapes {shape} and {tuple(first.shape)}; "
                    f"only axis {axis} may differ)"
                )
    if problems:
        raise SourceMismatchError(
            "cannot concatenate along axis {}: {}".format(axis, "; ".join(problems))
        )
    return axis


# ------------------------------------------------------------ description file
def _to_stored(src: str, base: Path) -> str:
    """How a source is written into a description file living in ``base``."""
    if _is_url(src):
        return src
    p = Path(src).expanduser().absolute()
    try:
        return p.relative_to(base).as_posix()
    except ValueError:
        return os.fspath(p)


def _from_stored(src: str, base: Path) -> str:
    if _is_url(src) or os.path.isabs(src):
        return src
    return os.fspath(base / src)


def save_concat(
    path: str | os.PathLike[str], sources: Sequence[str | os.PathLike[str]], axis: int
) -> ConcatArray:
    """Write a concat description file at ``path`` after checking that the
    sources agree.  Local sources under the file's directory are stored
    relative to it (so the whole tree can be moved), others absolute; URLs
    verbatim.  Returns the (read-only) concatenation."""
    path = Path(path)
    base = path.expanduser().absolute().parent
    srcs = [os.fspath(s) for s in sources]
    ca = concat(srcs, axis, mode="r")  # validates before anything is written
    doc = {
        DESCRIPTION_KEY: DESCRIPTION_VERSION,
        "axis": ca.axis,
        "sources": [_to_stored(s, base) for s in srcs],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)  # atomic: a reader never sees half a description
    return ca


def _read_description(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        # non-blocking, and only a regular file read: a FIFO swapped in since the path
        # was looked at would block the reader (a reload, the mount) for ever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (IsADirectoryError, NotADirectoryError) as e:
        raise MetadataError(f"{os.fspath(path)}: not a concat description file") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MetadataError(f"{os.fspath(path)}: not a regular file, so no concat description file")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(_MAX_DESCRIPTION_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_DESCRIPTION_BYTES:
        raise MetadataError(f"{os.fspath(path)}: too large for a concat description file")
    depth = nesting_depth(raw)
    if depth > MAX_METADATA_DEPTH:  # (json's parser recursed to a RecursionError)
        raise MetadataError(f"{os.fspath(path)}: JSON nested {depth} deep, past the {MAX_METADATA_DEPTH} "
                            "a concat description can be")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetadataError(f"{os.fspath(path)}: not valid JSON: {e}") from e
    if not isinstance(doc, dict) or DESCRIPTION_KEY not in doc:
        raise MetadataError(
            f"{os.fspath(path)}: no {DESCRIPTION_KEY!r} key; not a concat description"
        )
    return doc


def description_sources(path: str | os.PathLike[str]) -> list[str]:
    """The sources a concat description file names, resolved as `load_concat` opens
    them; [] if `path` is no such file."""
    try:
        if not os.path.isfile(path):
            return []
        doc = _read_description(path)
    except (OSError, MetadataError):
        return []
    srcs = doc.get("sources")
    if not isinstance(srcs, list) or not all(isinstance(s, str) for s in srcs):
        return []
    base = Path(path).expanduser().absolute().parent
    return list(dict.fromkeys(_from_stored(s, base) for s in srcs))


def is_concat_description(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a file whose JSON has the ``"zfuse_concat"`` key."""
    try:
        if not os.path.isfile(path):
            return False
        _read_description(path)
    except (OSError, MetadataError):
        return False
    return True


def load_concat(path: str | os.PathLike[str], mode: str = "r",
                store_of: Callable[[str], Any] | None = None, **open_kwargs: Any) -> ConcatArray:
    """Open the concatenation described by the file at ``path``; relative
    source paths are resolved against the file's directory.  ``open_kwargs``
    go to the opener of every source (e.g. ``storage_options``). ``store_of``: the
    Store each source path or URL is opened on (a mount's own stores, which read
    nothing outside a local source's directory); by default zarr's."""
    doc = _read_description(path)
    where = os.fspath(path)
    if doc[DESCRIPTION_KEY] != DESCRIPTION_VERSION:
        raise MetadataError(
            f"{where}: unsupported {DESCRIPTION_KEY} version {doc[DESCRIPTION_KEY]!r} "
            f"(this zfuse reads version {DESCRIPTION_VERSION})"
        )
    axis = doc.get("axis")
    srcs = doc.get("sources")
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise MetadataError(f"{where}: 'axis' must be an integer, got {axis!r}")
    if not isinstance(srcs, list) or not all(isinstance(s, str) for s in srcs) or not srcs:
        raise MetadataError(f"{where}: 'sources' must be a non-empty list of strings")
    base = Path(path).expanduser().absolute().parent
    resolved = [_from_stored(s, base) for s in srcs]
    if store_of is None:
        return concat(resolved, axis, mode=mode, **open_kwargs)
    stores: dict[str, Any] = {}  # (a source named again: one store, as `concat` opens it once)
    for source in resolved:
        if source not in stores:
            stores[source] = store_of(source)
    return concat([stores[s] for s in resolved], axis, mode=mode, names=resolved, **open_kwargs)


def describe(ca: ConcatArray, max_straddling: int = 100) -> dict[str, Any]:
    """Summary for ``zfuse info``: sources with their offsets along the axis
    and the view chunks that straddle a source boundary (at most
    ``max_straddling`` listed; ``straddling_total`` counts them all)."""
    return {
        "axis": ca.axis,
        "shape": list(ca.shape),
        "dtype": str(ca.dtype),
        "chunks": list(ca.chunks),
        "fill_value": ca.fill_value.item() if hasattr(ca.fill_value, "item") else ca.fill_value,
        "sources": [
            {
                "index": i,
                "name": name,
                "shape": list(src.shape),
                "offset": off,
                "chunks": list(src.chunks),
                "shards": list(src.shards) if src.shards else None,
            }
            for i, (src, name, off) in enumerate(zip(ca.sources, ca.names, ca.offsets, strict=True))
        ],
        "straddling_chunks": [
            list(c) for c in itertools.islice(ca.straddling_chunks(), max_straddling)
        ],
        "straddling_total": ca.count_straddling_chunks(),
    }
