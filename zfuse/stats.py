"""Counters the daemon reports in the mount's hidden `.zfuse/stats` file."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Stats:
    """Thread-safe named counters (store requests and bytes, decodes, errors, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, Callable[[], float]] = {}
        self._in_flight: dict[object, float] = {}  # store requests under way: their start (monotonic)
        self.started = time.time()

    def __getstate__(self) -> dict[str, Any]:
        # zarr pickles stores (MeteredStore holds a Stats): the counts travel; the lock is
        # recreated, and gauges stay behind, since they read this process's live caches.
        with self._lock:
            return {"counters": dict(self._counters), "started": self.started}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._counters = dict(state["counters"])
        self._gauges = {}
        self._in_flight = {}
        self.started = state["started"]

    def count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + amount

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """A value read when the stats are shown (a cache's current size); a later
        gauge of the same name replaces it (a reload's new view)."""
        with self._lock:
            self._gauges[name] = read

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Around one store request: shown as `store_requests_in_flight` (how many are
        under way now) and `store_oldest_request_s` (how long the oldest has waited)."""
        token = object()
        with self._lock:
            self._in_flight[token] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                del self._in_flight[token]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
            gauges = list(self._gauges.items())
            starts = list(self._in_flight.values())
        for name, read in gauges:
            out[name] = read()
        out["store_requests_in_flight"] = len(starts)
        out["store_oldest_request_s"] = round(time.monotonic() - min(starts), 1) if starts else 0
        out["uptime_s"] = round(time.time() - self.started, 3)
        return out
