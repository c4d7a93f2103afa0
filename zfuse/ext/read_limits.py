"""How many bytes the stored object being read can hold, as its reader knows it.

zarr's Store API has no place for a bound on a read: a reader that knows what an
object can hold (a chunk: twice its values and a MiB; a concat-parts part: its size)
sets it around its requests (`chunk_read_limited`), and the stores below read a whole
chunk object no further (`chunk_read_limit`): a crafted sparse terabyte, or a server's
endless body, is refused unread. A context variable, so it follows the requests onto
zarr's event loop and into the tasks they start, and never into another reader's.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

#: bytes the (inner) chunk object being read can be stored in; None: not known
chunk_read_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("chunk_read_limit", default=None)


@contextlib.contextmanager
def chunk_read_limited(limit: int | None) -> Iterator[None]:
    """The requests made inside (and the tasks they start) read a whole chunk object to
    at most `limit` bytes (`chunk_read_limit`); None: as the stores below decide."""
    if limit is None:
        yield
        return
    token = chunk_read_limit.set(limit)
    try:
        yield
    finally:
        chunk_read_limit.reset(token)
