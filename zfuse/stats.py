"""Counters the daemon reports in the mount's hidden `.zfuse/stats` file."""

from __future__ import annotations

import threading
import time
from typing import Any


class Stats:
    """Thread-safe named counters (store requests and bytes, decodes, errors, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self.started = time.time()

    def count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + amount

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
        out["uptime_s"] = round(time.time() - self.started, 3)
        return out
