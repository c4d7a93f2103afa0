"""Counters the daemon reports in the mount's hidden `.zfuse/stats` file."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Stats:
    """Thread-safe named counters (store requests and bytes, decodes, errors, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, Callable[[], float]] = {}
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
        self.started = state["started"]

    def count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + amount

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """A value read when the stats are shown (a cache's current size); a later
        gauge of the same name replaces it (a reload's new view)."""
        with self._lock:
            self._gauges[name] = read

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
            gauges = list(self._gauges.items())
        for name, read in gauges:
            out[name] = read()
        out["uptime_s"] = round(time.time() - self.started, 3)
        return out
