"""The man page: generated from the CLI parser, current, valid roff, found by `man zfuse`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zfuse.manpage import render

PAGE = Path(__file__).parents[1] / "man" / "zfuse.1"


def test_shipped_man_page_is_current() -> None:
    assert PAGE.read_text() == render(), "regenerate: python -m zfuse.manpage > man/zfuse.1"


def test_man_page_covers_every_command_and_option() -> None:
    import argparse

    from zfuse.cli import MOUNT_OPTIONS, build_parser

    text = PAGE.read_text().replace("\\-", "-")
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in sub.choices.items():
        assert f'.SS "zfuse {name}"' in text
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help", "--ready-fd"):
                    assert option in text, (name, option)
    for option in MOUNT_OPTIONS:
        assert f".B {option.spelled}\n" in text
    for section in ("WHEN SOMETHING GOES WRONG", "SIGNALS", "FILES INSIDE A MOUNT"):
        assert f".SH {section}" in text


def test_man_page_is_valid_roff_and_man_finds_it() -> None:
    if shutil.which("groff") is None or shutil.which("man") is None:
        pytest.skip("groff/man not installed")
    check = subprocess.run(["groff", "-man", "-ww", "-z", str(PAGE)], capture_output=True, text=True)
    assert check.returncode == 0 and check.stderr == "", check.stderr
    # man(1) searches <prefix>/share/man for every <prefix>/bin on PATH: the venv's
    env = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}:{os.environ.get('PATH', '')}"}
    where = subprocess.run(["man", "-w", "zfuse"], capture_output=True, text=True, env=env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).read_text() == PAGE.read_text()
