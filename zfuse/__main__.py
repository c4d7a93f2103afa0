"""The `zfuse` command (console script, and `python -m zfuse`).

A mount re-executes itself with glibc's malloc tuned (zfuse/launch.py) before the CLI
and everything it imports are loaded: the cost is one bare interpreter start.
"""

from __future__ import annotations

import sys

from zfuse.launch import exec_tuned


def main() -> int:
    exec_tuned(sys.argv[1:])
    from zfuse.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
