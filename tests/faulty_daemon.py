"""`zfuse` with every store it opens wrapped in `zfuse.testing.FaultyStore` (tests only).

    python tests/faulty_daemon.py CONTROL JOURNAL mount SOURCE MOUNTPOINT -f ...

CONTROL is the JSON file of fault rules (`zfuse.testing.write_faults`), read again by
the daemon whenever it changes; JOURNAL is where it records each injected fault
(`zfuse.testing.read_fault_journal`). Everything after them is `zfuse`'s own command
line. The wrapper sits under zfuse's `MeteredStore`, as a remote store would: the
daemon's local-directory shortcuts (reads and writes in worker threads, stored bytes
served as they are) do not apply, and every request is bounded by `-o timeout=`.
zfuse itself is unchanged: `zfuse.store.open_store` is replaced in this process only.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> int:
    control, journal, *args = argv
    import zfuse.store
    from zfuse.cli import main as zfuse_main
    from zfuse.testing import FaultyStore

    real_open_store = zfuse.store.open_store

    def open_store(source: str, **kwargs: Any) -> Any:
        return FaultyStore(real_open_store(source, **kwargs), control=control, journal=journal)

    zfuse.store.open_store = open_store  # open_view imports it from zfuse.store at each call
    return zfuse_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
