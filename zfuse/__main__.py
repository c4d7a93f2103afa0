"""The `zfuse` command (console script, and `python -m zfuse`)."""

from __future__ import annotations

import sys

from zfuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
