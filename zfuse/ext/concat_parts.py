"""The ``concat-parts`` storage transformer (spec: docs/specs/concat-parts.md, version 0.1).

A chunk is the concatenation, in order, of the objects ``key + part.key_suffix``
for every configured part.

Invariants
----------
* Configuration: a non-empty ``parts`` list of at most PARTS_MAX parts (a chunk
  read costs a request per part: a crafted list of 400,000 fits a 16 MB
  ``zarr.json``); every part has a string ``key_suffix`` (distinct) and
  optionally a non-negative integer ``size``.
  Reading works with any number of unsized parts; writing needs at most one
  (MetadataError otherwise, naming ``parts``).
* Read: a chunk whose parts are all absent is absent; some present and some
  absent -> CorruptDataError naming the missing part keys.  A sized part whose
  length differs from its ``size`` -> CorruptDataError naming the part key.
* Write: the block is validated before anything is stored (shorter than the
  fixed parts, or not exactly their total when every part is sized ->
  MetadataError naming the key), then split and each part written.
* Delete removes every part.
* A byte-range read touches only the parts it overlaps.  Request counts, with
  P/S the fixed parts before/after the (at most one) unsized part U:

  - whole chunk: one ``get`` per part (issued concurrently);
  - range inside the fixed parts before U, or a suffix range no longer than
    the fixed parts after U: one ranged ``get`` per overlapping part, nothing
    else (this is how a sharding index at the end is read: one request);
  - range reaching into U: one ranged ``get`` of U (plus the overlapping
    leading parts, concurrently); only when the range runs past U's end, a
    second round of ranged ``get`` for the overlapping trailing parts (U's
    length is learnt from the short read, or by one ``getsize`` if the range
    started beyond U's end);
  - suffix range longer than the trailing fixed parts: one ``getsize`` of U,
    then one ranged ``get`` per overlapping part;
  - every part sized: one ranged ``get`` per overlapping part.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from zfuse.errors import CorruptDataError, MetadataError
from zfuse.ext.layers import ChunkIO, slice_for_request
from zfuse.ext.read_limits import chunk_read_limited

__all__ = ["PARTS_MAX", "ConcatPartsConfig", "ConcatPartsIO", "Part", "parse_concat_parts"]

PARTS_MAX = 1024  # parts of one chunk: each costs a request when the chunk is read


@dataclass(frozen=True)
class Part:
    key_suffix: str
    size: int | None


@dataclass(frozen=True)
class ConcatPartsConfig:
    parts: tuple[Part, ...]
    field: str = "storage_transformers[?]"

    @property
    def unsized(self) -> list[int]:
        return [i for i, p in enumerate(self.parts) if p.size is None]

    @property
    def fixed_total(self) -> int:
        return sum(p.size for p in self.parts if p.size is not None)

    @property
    def anchor(self) -> Part:
        """The part whose presence stands for the chunk's (the main part)."""
        for p in self.parts:
            if p.key_suffix == "":
                return p
        unsized = self.unsized
        return self.parts[unsized[0]] if unsized else self.parts[0]

    def check_writable(self) -> None:
        if len(self.unsized) > 1:
            suffixes = [self.parts[i].key_suffix for i in self.unsized]
            raise MetadataError(
                f"{self.field}.configuration.parts: {len(suffixes)} parts without 'size' "
                f"(key_suffix {suffixes}); writing needs a size for all but at most one part"
            )


def parse_concat_parts(
    doc: dict[str, Any], *, field: str = "storage_transformers[?]"
) -> ConcatPartsConfig:
    """Validate a ``concat-parts`` transformer document (MetadataError naming the field)."""
    conf = doc.get("configuration")
    if not isinstance(conf, dict):
        raise MetadataError(f"{field}.configuration: missing or not an object")
    parts = conf.get("parts")
    if not isinstance(parts, list) or not parts:
        raise MetadataError(f"{field}.configuration.parts: must be a non-empty list, got {parts!r}")
    if len(parts) > PARTS_MAX:
        raise MetadataError(f"{field}.configuration.parts: {len(parts)} parts, more than zfuse reads "
                            f"({PARTS_MAX}: a chunk read costs a request per part)")
    out: list[Part] = []
    seen: set[str] = set()
    for i, p in enumerate(parts):
        pf = f"{field}.configuration.parts[{i}]"
        if not isinstance(p, dict):
            raise MetadataError(f"{pf}: must be an object, got {p!r}")
        suffix = p.get("key_suffix")
        if not isinstance(suffix, str):
            raise MetadataError(f"{pf}.key_suffix: required string, got {suffix!r}")
        if suffix in seen:
            raise MetadataError(f"{pf}.key_suffix: {suffix!r} used by two parts")
        seen.add(suffix)
        size = p.get("size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise MetadataError(f"{pf}.size: must be a non-negative integer, got {size!r}")
        out.append(Part(suffix, size))
    return ConcatPartsConfig(tuple(out), field)


class ConcatPartsIO(ChunkIO):
    """concat-parts over ``inner`` (the next layer toward the store)."""

    def __init__(self, inner: ChunkIO, config: ConcatPartsConfig) -> None:
        self.inner = inner
        self.config = config
        parts = config.parts
        unsized = config.unsized
        # With exactly one unsized part U: fixed parts before it [0, u) and after it (u, n).
        self._u: int | None = unsized[0] if len(unsized) == 1 else None
        self._multi_unsized = len(unsized) > 1
        self._head = sum(p.size or 0 for p in parts[: self._u]) if self._u is not None else 0
        self._tail = sum(p.size or 0 for p in parts[self._u + 1 :]) if self._u is not None else 0

    def full_key(self, key: str) -> str:
        return self.inner.full_key(key)

    @property
    def lock_namespace(self) -> str:
        return self.inner.lock_namespace

    def _pk(self, key: str, part: Part) -> str:
        return key + part.key_suffix

    def _missing(self, key: str, got: dict[int, bytes | None]) -> None:
        """Raise if some parts were read and others are absent; caller handles all-absent."""
        missing = [i for i, v in got.items() if v is None]
        if missing and len(missing) < len(got):
            names = [self.full_key(self._pk(key, self.config.parts[i])) for i in missing]
            raise CorruptDataError(
                f"concat-parts: chunk {self.full_key(key)!r} is missing part(s) {names} "
                f"while other parts exist"
            )

    def _check_size(self, key: str, i: int, data: bytes, expected: int) -> None:
        """`data`: the part as `_get_part` read it (to one byte past its size)."""
        if len(data) != expected:
            part = self.config.parts[i]
            held = f"more than {expected}" if len(data) > expected else str(len(data))
            raise CorruptDataError(
                f"concat-parts: part {self.full_key(self._pk(key, part))!r} holds {held} bytes, "
                f"expected {expected}"
            )

    async def _get_part(self, key: str, size: int | None) -> bytes | None:
        """A part read whole (so that its version is the one a write is conditioned on,
        on stores that have versions), a sized one to at most one byte past its size:
        a part far longer than it should be (a crafted 3 GB `.crc32c`) is found wrong
        without being read."""
        if size is None:
            return await self.inner.get(key)
        with chunk_read_limited(size + 1):
            return await self.inner.get(key)

    # -- read ------------------------------------------------------------------------

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        if byte_range is None:
            return await self._get_whole(key)
        if self._multi_unsized:
            # Offsets are unknown without reading every unsized part; keep it simple.
            whole = await self._get_whole(key)
            if whole is None:
                return None
            start, stop = slice_for_request(len(whole), byte_range)
            return whole[start:stop]
        if self._u is None:
            total = self.config.fixed_total
            start, stop = _resolve(byte_range, total)
            return await self._read_fixed_layout(key, start, stop, u_len=None)
        if isinstance(byte_range, SuffixByteRequest):
            if byte_range.suffix <= self._tail:
                # Entirely within the trailing fixed parts: their offsets from the end are known.
                return await self._read_tail(key, byte_range.suffix)
            try:
                u_len = await self.inner.getsize(self._pk(key, self.config.parts[self._u]))
            except FileNotFoundError:
                return await self._absent_or_corrupt(key)
            total = self._head + u_len + self._tail
            start, stop = _resolve(byte_range, total)
            return await self._read_fixed_layout(key, start, stop, u_len=u_len)
        if isinstance(byte_range, RangeByteRequest):
            return await self._read_from_start(key, byte_range.start, byte_range.end)
        if isinstance(byte_range, OffsetByteRequest):
            return await self._read_from_start(key, byte_range.offset, None)
        raise TypeError(f"unexpected byte range {byte_range!r}")  # pragma: no cover

    async def _get_whole(self, key: str) -> bytes | None:
        parts = self.config.parts
        values = await asyncio.gather(*(self._get_part(self._pk(key, p), p.size) for p in parts))
        got = dict(enumerate(values))
        if all(v is None for v in values):
            return None
        self._missing(key, got)
        for i, (p, v) in enumerate(zip(parts, values, strict=True)):
            assert v is not None
            if p.size is not None:
                self._check_size(key, i, v, p.size)
        return b"".join(v for v in values if v is not None)

    async def _absent_or_corrupt(self, key: str) -> None:
        """The anchor/U part is absent: fine if every part is, corrupt otherwise."""
        present = await asyncio.gather(
            *(self.inner.exists(self._pk(key, p)) for p in self.config.parts)
        )
        self._missing(key, {i: (b"" if e else None) for i, e in enumerate(present)})
        return None

    def _offsets(self, u_len: int | None) -> list[tuple[int, int]]:
        """[start, stop) of every part within the chunk (U's length must be known if present)."""
        out, pos = [], 0
        for p in self.config.parts:
            n = p.size if p.size is not None else u_len
            assert n is not None
            out.append((pos, pos + n))
            pos += n
        return out

    async def _read_parts(
        self, key: str, requests: dict[int, tuple[int, int]]
    ) -> dict[int, bytes | None]:
        """Read [lo, hi) (part-relative) of each requested part; whole sized parts unranged
        (so their size is checked)."""
        parts = self.config.parts
        idx = list(requests)

        async def one(i: int) -> bytes | None:
            lo, hi = requests[i]
            size = parts[i].size
            if lo == 0 and size is not None and hi == size:
                data = await self._get_part(self._pk(key, parts[i]), size)
                if data is not None:
                    self._check_size(key, i, data, size)
                return data
            data = await self.inner.get(self._pk(key, parts[i]), RangeByteRequest(lo, hi))
            if data is not None and size is not None and len(data) != hi - lo:
                raise CorruptDataError(
                    f"concat-parts: part {self.full_key(self._pk(key, parts[i]))!r} is shorter "
                    f"than its size {size}"
                )
            return data

        values = await asyncio.gather(*(one(i) for i in idx))
        return dict(zip(idx, values, strict=True))

    async def _read_fixed_layout(
        self, key: str, start: int, stop: int, *, u_len: int | None
    ) -> bytes | None:
        """Read [start, stop) when every part's extent is known."""
        spans = self._offsets(u_len)
        requests = {
            i: (max(start, a) - a, min(stop, b) - a)
            for i, (a, b) in enumerate(spans)
            if max(start, a) < min(stop, b)
        }
        if not requests:
            # Empty range: still say whether the chunk exists.
            return b"" if await self.exists(key) else None
        got = await self._read_parts(key, requests)
        return self._assemble(key, got)

    def _assemble(self, key: str, got: dict[int, bytes | None]) -> bytes | None:
        if all(v is None for v in got.values()):
            return None
        self._missing(key, got)
        return b"".join(got[i] or b"" for i in sorted(got))

    async def _read_tail(self, key: str, n: int) -> bytes | None:
        """The last ``n`` bytes, all within the fixed parts after U."""
        assert self._u is not None
        parts = self.config.parts
        requests: dict[int, tuple[int, int]] = {}
        end = self._tail  # positions measured within the tail region [0, tail)
        pos = 0
        for i in range(self._u + 1, len(parts)):
            size = parts[i].size or 0
            a, b = pos, pos + size
            lo = max(a, end - n)
            if lo < b:
                requests[i] = (lo - a, size)
            pos = b
        if not requests:
            return b"" if await self.exists(key) else None
        got = await self._read_parts(key, requests)
        return self._assemble(key, got)

    async def _read_from_start(self, key: str, start: int, stop: int | None) -> bytes | None:
        """[start, stop) (stop None = to the end) with U's length unknown up front."""
        assert self._u is not None
        parts = self.config.parts
        u, head = self._u, self._head
        if stop is not None and stop <= head:
            # Entirely in the leading fixed parts.
            return await self._read_fixed_layout(key, start, stop, u_len=0)
        # Round 1: leading parts overlapping, and U from max(start - head, 0).
        requests: dict[int, tuple[int, int]] = {}
        pos = 0
        for i in range(u):
            size = parts[i].size or 0
            lo, hi = max(start, pos), min(head, pos + size)
            if lo < hi:
                requests[i] = (lo - pos, hi - pos)
            pos += size
        u_from = max(start - head, 0)
        u_key = self._pk(key, parts[u])
        u_req: ByteRequest | None
        if stop is None:
            u_req = OffsetByteRequest(u_from) if u_from else None
        else:
            u_req = RangeByteRequest(u_from, stop - head)
        lead, u_data = await asyncio.gather(
            self._read_parts(key, requests), self.inner.get(u_key, u_req)
        )
        got: dict[int, bytes | None] = {**lead, u: u_data}
        if u_data is None:
            if all(v is None for v in got.values()):
                # U absent: the chunk is absent unless some other part exists.
                return await self._absent_or_corrupt(key)
            self._missing(key, got)
        assert u_data is not None
        wanted = None if stop is None else stop - head - u_from
        if wanted is not None and len(u_data) >= wanted:
            return self._assemble(key, got)  # the range ended inside U
        # U ended inside the range: learn its length, then read the trailing parts.
        if u_data or u_from == 0:
            u_len = u_from + len(u_data)
        else:
            u_len = await self.inner.getsize(u_key)
        tail_start = head + u_len
        requests = {}
        pos = tail_start
        for i in range(u + 1, len(parts)):
            size = parts[i].size or 0
            lo = max(start, pos)
            hi = pos + size if stop is None else min(stop, pos + size)
            if lo < hi:
                requests[i] = (lo - pos, hi - pos)
            pos += size
        if requests:
            got.update(await self._read_parts(key, requests))
        return self._assemble(key, got)

    # -- write -----------------------------------------------------------------------

    def _split(self, key: str, value: bytes) -> list[bytes]:
        self.config.check_writable()
        parts = self.config.parts
        fixed = self.config.fixed_total
        n = len(value)
        sizes = ", ".join(
            f"{p.key_suffix or '(main)'}={p.size}" for p in parts if p.size is not None
        )
        if n < fixed or (self._u is None and n != fixed):
            relation = "shorter than" if n < fixed else "longer than"
            raise MetadataError(
                f"concat-parts: block for chunk {self.full_key(key)!r} is {n} bytes, {relation} "
                f"the {fixed} bytes of its fixed-size parts ({sizes}) "
                f"({self.config.field}.configuration.parts)"
            )
        u_len = n - fixed
        out, pos = [], 0
        for p in parts:
            size = p.size if p.size is not None else u_len
            out.append(value[pos : pos + size])
            pos += size
        return out

    async def set(self, key: str, value: bytes) -> None:
        pieces = self._split(key, value)  # validated before anything is stored
        await asyncio.gather(
            *(
                self.inner.set(self._pk(key, p), piece)
                for p, piece in zip(self.config.parts, pieces, strict=True)
            )
        )

    async def delete(self, key: str) -> None:
        await asyncio.gather(*(self.inner.delete(self._pk(key, p)) for p in self.config.parts))

    async def exists(self, key: str) -> bool:
        return await self.inner.exists(self._pk(key, self.config.anchor))

    async def getsize(self, key: str) -> int:
        parts = self.config.parts
        unsized = [p for p in parts if p.size is None]
        if not unsized:
            if not await self.exists(key):
                raise FileNotFoundError(self.full_key(key))
            return self.config.fixed_total
        sizes = await asyncio.gather(*(self.inner.getsize(self._pk(key, p)) for p in unsized))
        return self.config.fixed_total + sum(sizes)

    async def list_keys(self) -> list[str]:
        raw = set(await self.inner.list_keys())
        anchor = self.config.anchor.key_suffix
        cut = len(anchor)
        candidates = {k[: len(k) - cut] if cut else k for k in raw if k.endswith(anchor)}
        # With an empty anchor suffix every raw key is a candidate: drop the other parts.
        others = [p.key_suffix for p in self.config.parts if p.key_suffix != anchor]
        part_keys = {c + s for c in candidates for s in others}
        return sorted(candidates - part_keys)


def _resolve(byte_range: ByteRequest, total: int) -> tuple[int, int]:
    return slice_for_request(total, byte_range)
