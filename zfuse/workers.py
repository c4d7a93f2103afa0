"""Daemon threads running background jobs from a queue (read-ahead, listing ahead,
freeing replaced store objects): no trio, no FUSE."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("zfuse.workers")


class WorkerThreads:
    """Daemon threads running background jobs from a queue, started at the first job:
    `submit` costs the event loop one queue put, where a `trio.to_thread` job costs a
    task, a thread hand-off and a wake-up of the loop to deliver the result. Jobs
    report nothing back; a failing job is logged. Threads end with the process.
    `submit` may be called from any thread."""

    def __init__(self, count: int, name: str) -> None:
        self.count = count
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[Any], None], Any]] = queue.SimpleQueue()
        self._started = 0
        self._starting = threading.Lock()

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        self._jobs.put((fn, arg))
        if self._started < self.count:
            with self._starting:
                while self._started < self.count:
                    self._started += 1
                    threading.Thread(target=self._work, name=f"{self.name}-{self._started}", daemon=True).start()

    def waiting(self) -> int:
        """Jobs submitted and not yet taken by a thread (approximately)."""
        return self._jobs.qsize()

    def _work(self) -> None:
        while True:
            fn, arg = self._jobs.get()
            try:
                fn(arg)
            except Exception:
                log.exception("background job %s failed", getattr(fn, "__name__", fn))
            # not kept while waiting for the next job (a job's argument may hold a whole view)
            del fn, arg
