"""`make install`: the documented step that puts `zfuse` and its man page where a
shell's default PATH, mount(8) (through mount.fuse3's `sh -c`) and man find them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_make_install_puts_zfuse_and_its_man_page_in_place(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is missing")
    prefix = tmp_path / "usr-local"
    subprocess.run(["make", "-C", str(REPO), "install", f"PREFIX={prefix}"], check=True,
                   capture_output=True, timeout=600)
    command = prefix / "bin" / "zfuse"
    assert command.is_symlink() and command.resolve() == (REPO / ".venv" / "bin" / "zfuse").resolve()
    # found the way mount.fuse3 finds it: sh -c with nothing but a default-style PATH
    found = subprocess.run(["env", "-i", f"PATH={prefix / 'bin'}:/usr/bin:/bin", "sh", "-c", "zfuse --version"],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0 and found.stdout.startswith("zfuse"), found.stderr
    page = prefix / "share" / "man" / "man1" / "zfuse.1"
    assert page.read_text() == (REPO / "man" / "zfuse.1").read_text()
    if shutil.which("man"):
        where = subprocess.run(["man", "-w", "zfuse"], capture_output=True, text=True,
                               env={"MANPATH": str(prefix / "share" / "man"), "PATH": "/usr/bin:/bin"})
        assert where.stdout.strip() == str(page), where.stderr
    subprocess.run(["make", "-C", str(REPO), "uninstall", f"PREFIX={prefix}"], check=True,
                   capture_output=True, timeout=60)
    assert not command.exists() and not command.is_symlink() and not page.exists()
