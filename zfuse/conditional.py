"""Redoing a write that lost a race with another host (issue 30 item 4). No FUSE.

Writes to an object store that honours conditions are made on condition that the
object is still the version the mount read (`zfuse.store.MeteredStore.set`:
If-Match, or If-None-Match: * for a new object). When another writer got there
first the store refuses the write (`WriteConflictError`, nothing written), and
the whole read-modify-write is redone from the new version: a shard's other
inner chunks, or a part's other bytes, are then the other writer's. After
CONFLICT_RETRIES lost races in a row the write fails with ESTALE (close() says so).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from zfuse.remote_objects import WriteConflictError

log = logging.getLogger(__name__)
T = TypeVar("T")

CONFLICT_RETRIES = 12
# the longest wait between two attempts, seconds: random, growing from a few ms, so two
# hosts that keep colliding on one shard fall out of step
BACKOFF_MAX = 0.5


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt number `attempt` + 1 (random, bounded)."""
    return random.uniform(0, min(BACKOFF_MAX, 0.005 * 2**attempt))


def retry_lost_races(write: Callable[[], T], label: str, sleep: Callable[[float], None] = time.sleep) -> T:
    """`write()` (a whole read-modify-write), redone while another writer changed the
    object between its read and its write; the last WriteConflictError after
    CONFLICT_RETRIES attempts. Runs in a worker thread (it waits between attempts)."""
    for attempt in range(CONFLICT_RETRIES):
        try:
            return write()
        except WriteConflictError as e:
            if attempt == CONFLICT_RETRIES - 1:
                log.warning("%s: gave up after %d writes lost to other writers: %s", label, CONFLICT_RETRIES, e)
                raise
            log.info("%s: lost a race with another writer, redone from its version (%s)", label, e)
            sleep(backoff(attempt))
    raise AssertionError("unreachable")
