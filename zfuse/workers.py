"""Daemon threads running background jobs from a queue: no trio, no FUSE.

The daemon runs work in threads two ways. A request's own blocking work (a
decode, a store read it waits for) runs through `trio.to_thread` with the
request limiter, which hands the result back to the event loop. Work nobody
waits for (read-ahead, listing ahead, freeing replaced store objects, chunk
files asked of the OS ahead of a whole-image reader, the further tiles of one
read decoded side by side) runs on `WorkerThreads`: no result, no task, one
queue put per job.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("zfuse.workers")

Job = tuple[Callable[[Any], None], Any]


class _Jobs:
    """The queue the threads share with their `WorkerThreads` (they hold no reference to
    it: one nobody holds any more is collected, and its threads end). Unbounded (a
    SimpleQueue: one C call per put), or keeping only the latest `keep` jobs (a reader
    that moved on needs no old ones)."""

    def __init__(self, keep: int | None) -> None:
        self.closed = False
        self.simple: queue.SimpleQueue[Job | None] | None = queue.SimpleQueue() if keep is None else None
        self.latest: collections.deque[Job] = collections.deque(maxlen=keep or 1)
        self.wake = threading.Condition()

    def put(self, job: Job) -> None:
        if self.simple is not None:
            self.simple.put(job)
            return
        with self.wake:
            self.latest.append(job)
            self.wake.notify()

    def get(self) -> Job | None:
        """The next job; None once closed."""
        if self.simple is not None:
            return None if self.closed else self.simple.get()
        with self.wake:
            while not self.latest and not self.closed:
                self.wake.wait()
            return None if self.closed else self.latest.popleft()

    def waiting(self) -> int:
        return self.simple.qsize() if self.simple is not None else len(self.latest)

    def close(self, threads: int) -> None:
        """Jobs not started are dropped; each thread ends after its job under way."""
        self.closed = True
        if self.simple is not None:
            for _ in range(threads):
                self.simple.put(None)
        with self.wake:
            self.latest.clear()
            self.wake.notify_all()


def _work(jobs: _Jobs) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, arg = job
        try:
            fn(arg)
        except Exception:
            log.exception("background job %s failed", getattr(fn, "__name__", fn))
        # not kept while waiting for the next job (a job's argument may hold a whole view)
        del job, fn, arg


class WorkerThreads:
    """Daemon threads running background jobs from a queue, started at the first job
    (after any fork): `submit` costs the caller one queue put, where a `trio.to_thread`
    job costs a task, a thread hand-off and a wake-up of the loop to deliver the
    result. Jobs report nothing back; a failing job is logged. `keep`: only the latest
    `keep` jobs not started yet are kept. `close` (or dropping the object) ends the
    threads. `submit` may be called from any thread."""

    def __init__(self, count: int, name: str, keep: int | None = None) -> None:
        self.count = count
        self.name = name
        self._jobs = _Jobs(keep)
        self._started = 0
        self._starting = threading.Lock()
        self._finalizer = weakref.finalize(self, self._jobs.close, count)

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        jobs = self._jobs
        if jobs.closed:
            return
        jobs.put((fn, arg))
        if self._started < self.count:
            with self._starting:
                while self._started < self.count:
                    self._started += 1
                    threading.Thread(target=_work, args=(jobs,), name=f"{self.name}-{self._started}",
                                     daemon=True).start()

    def waiting(self) -> int:
        """Jobs submitted and not yet taken by a thread (approximately)."""
        return self._jobs.waiting()

    def close(self) -> None:
        """Drop the jobs not started; the threads end after the ones under way."""
        self._finalizer()
