"""WorkerThreads with plain calls: jobs run in the background, only the latest are kept
where asked, and closing or dropping the object ends its threads."""

from __future__ import annotations

import gc
import threading

from zfuse.testing import wait_until
from zfuse.workers import WorkerThreads


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name)]


def test_jobs_run_in_the_threads_and_a_failing_one_is_only_logged() -> None:
    pool = WorkerThreads(2, "wt-run")
    done: list[int] = []
    pool.submit(lambda _: 1 / 0, None)
    for i in range(20):
        pool.submit(done.append, i)
    wait_until(lambda: len(done) == 20)
    assert sorted(done) == list(range(20)) and len(threads_named("wt-run")) == 2
    pool.close()
    wait_until(lambda: not threads_named("wt-run"))


def test_only_the_latest_jobs_are_kept_while_the_thread_is_busy() -> None:
    pool = WorkerThreads(1, "wt-keep", keep=3)
    busy, go = threading.Event(), threading.Event()
    ran: list[int] = []
    pool.submit(lambda _: (busy.set(), go.wait(10)), None)
    assert busy.wait(10)
    for i in range(10):
        pool.submit(ran.append, i)
    assert pool.waiting() == 3
    go.set()
    wait_until(lambda: len(ran) == 3)
    assert ran == [7, 8, 9]
    pool.close()


def test_dropping_the_object_ends_its_threads() -> None:
    pool = WorkerThreads(2, "wt-drop")
    seen = threading.Event()
    pool.submit(lambda _: seen.set(), None)
    assert seen.wait(10)
    del pool
    gc.collect()
    wait_until(lambda: not threads_named("wt-drop"))


def test_after_close_nothing_more_runs() -> None:
    pool = WorkerThreads(1, "wt-closed", keep=4)
    pool.close()
    ran: list[int] = []
    pool.submit(ran.append, 1)
    assert not threads_named("wt-closed") and ran == []
