"""What every whole-image file answers the filesystem, whatever its layout: `ImageFile`.

A read from memory only (`read_cached`: None when bytes must be decoded first),
a blocking read (`read`, in a worker thread), and, once the store changed under
an open file, a failure for every later read (`invalidate`: EIO, reopen it).
"""

from __future__ import annotations

from zfuse.view.whole_image.tiles import StaleImageError


class ImageFile:
    """The reads every whole-image file (tiled `WholeImage`, stripped `StrippedImage`)
    answers; a subclass says how bytes are made (`_read`)."""

    _failed: str | None = None  # why this file is stale (reopen)

    def invalidate(self, why: str) -> None:
        """Reads fail from now on (the store changed under an open file)."""
        self._failed = why

    def _check(self) -> None:
        if self._failed is not None:
            raise StaleImageError(self._failed)

    def read_cached(self, offset: int, size: int) -> bytes | None:
        """Bytes [offset, offset+size) from memory only; None when a read must decode."""
        self._check()
        return self._read(offset, size, blocking=False)  # type: ignore[return-value]

    def read(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset+size) (blocking: may look up sizes and decode chunks)."""
        self._check()
        data = self._read(offset, size, blocking=True)
        assert data is not None
        return data  # type: ignore[return-value]

    def _read(self, offset: int, size: int, *, blocking: bool) -> bytes | bytearray | memoryview | None:
        raise NotImplementedError
