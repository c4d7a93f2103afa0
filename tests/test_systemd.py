"""The shipped systemd units: `systemd-analyze verify`, and the Type=notify protocol.

The notify test plays systemd's part: it binds the NOTIFY_SOCKET datagram
socket itself, starts the ExecStart= command line of zfuse@.service (expanded
from an instance environment file the way systemd expands it), and checks that
READY=1 arrives only once the mount is live, and STOPPING=1 on SIGTERM, after
which the mount is gone and what an open file held is in the store.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import stores
from conftest import fuse_available, skip_or_fail

UNIT_DIR = Path(__file__).resolve().parent.parent / "systemd"
SHIPPED_ZFUSE = "/usr/local/bin/zfuse"
USER_ZFUSE = "%h/.local/bin/zfuse"  # (zfuse-user@.service, a user's own systemd)
VENV_ZFUSE = str(Path(sys.executable).parent / "zfuse")


def shipped_units() -> list[Path]:
    return sorted(p for p in UNIT_DIR.iterdir() if p.suffix in (".service", ".mount", ".automount"))


def test_units_are_shipped() -> None:
    names = [p.name for p in shipped_units()]
    assert "zfuse@.service" in names and any(n.endswith(".mount") for n in names), names


@pytest.mark.parametrize("unit", shipped_units(), ids=lambda p: p.name)
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        skip_or_fail("systemd-analyze is missing (Debian package systemd)")
    # verify insists that ExecStart= binaries exist: point the copy at this checkout's zfuse,
    # the one change from the shipped file.
    text = unit.read_text()
    copy = tmp_path / unit.name
    copy.write_text(text.replace(SHIPPED_ZFUSE, VENV_ZFUSE).replace(USER_ZFUSE, VENV_ZFUSE))
    assert copy.read_text().count(VENV_ZFUSE) == text.count(SHIPPED_ZFUSE) + text.count(USER_ZFUSE)
    result = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    # warnings (unknown keys, bad values) exit 0 but print: both must be clean
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), (
        result.stdout + result.stderr)


def test_mount_unit_name_matches_where() -> None:
    if shutil.which("systemd-escape") is None:
        skip_or_fail("systemd-escape is missing (Debian package systemd)")
    for unit in UNIT_DIR.glob("*.mount"):
        where = re.search(r"^Where=(.+)$", unit.read_text(), re.M)
        assert where, unit
        escaped = subprocess.run(["systemd-escape", "-p", "--suffix=mount", where.group(1).strip()],
                                 capture_output=True, text=True, check=True).stdout.strip()
        assert unit.name == escaped


# -- Type=notify ---------------------------------------------------------------


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (the simple subset we ship)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"')
    return env


def exec_start(unit: Path, env: dict[str, str]) -> list[str]:
    """ExecStart= expanded like systemd: ${VAR} is one word, $VAR splits on whitespace."""
    (line,) = re.findall(r"^ExecStart=(.+)$", unit.read_text(), re.M)
    argv: list[str] = []
    for word in line.split():
        if m := re.fullmatch(r"\$(\w+)", word):
            argv += env.get(m.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def test_example_env_file_gives_a_valid_command_line() -> None:
    from zfuse.cli import apply_mount_options, build_parser
    from zfuse.daemon import MountConfig

    argv = exec_start(UNIT_DIR / "zfuse@.service", read_env_file(UNIT_DIR / "zfuse-example.env"))
    assert argv == [SHIPPED_ZFUSE, "mount", "-f", "-o", "ro,allow_other,cache_size=512M,metadata_ttl=300,timeout=30",
                    "s3://my-bucket/images/a.zarr", "/mnt/a"]
    args = build_parser().parse_args(argv[1:])
    config = MountConfig(sources=args.sources, mountpoint=args.mountpoint)
    apply_mount_options(config, args.options)
    assert args.foreground and config.read_only and config.allow_other and config.fuse_options == []
    assert (config.cache_bytes, config.metadata_ttl, config.timeout) == (512 << 20, 300, 30)


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()


def receive(sock: socket.socket, timeout: float) -> dict[str, str]:
    sock.settimeout(timeout)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)


def test_notify_ready_when_live_and_stopping_on_sigterm(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    reason = fuse_available()
    if reason:
        skip_or_fail(reason)
    sock, sock_path = notify_socket
    src, mnt = tmp_path / "a.zarr", tmp_path / "mnt"
    stores.v3(src)
    mnt.mkdir()
    # an instance environment file, as /etc/zfuse/test.env would be
    env_file = tmp_path / "test.env"
    env_file.write_text(f"ZFUSE_SOURCE={src}\nZFUSE_MOUNTPOINT={mnt}\n"
                        "ZFUSE_OPTIONS=cache_size=64M,metadata_ttl=600\nZFUSE_ARGS=--crop-edges\n")
    unit_env = read_env_file(env_file)
    argv = exec_start(UNIT_DIR / "zfuse@.service", unit_env)
    assert argv[0] == SHIPPED_ZFUSE and "-f" in argv and str(src) in argv and "--crop-edges" in argv
    argv[0] = VENV_ZFUSE
    log = open(tmp_path / "daemon.log", "wb")
    # systemd connects stdout/stderr to the journal and says so in JOURNAL_STREAM
    st = os.fstat(log.fileno())
    env = {**os.environ, **unit_env, "NOTIFY_SOCKET": sock_path,
           "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    try:
        msg = receive(sock, timeout=60)
        # the very moment READY=1 arrives, the mount must already be there
        assert os.path.ismount(mnt)
        assert msg.get("READY") == "1", msg
        assert proc.poll() is None
        assert sorted(os.listdir(mnt / "c")) == ["0", "1", "2"]
        # under systemd the log is stderr, i.e. the journal
        assert json.loads((mnt / ".zfuse" / "mount").read_text())["log"] == "journal (stderr)"
        assert f"INFO zfuse.daemon: mounted {src} at {mnt}" in (tmp_path / "daemon.log").read_text()
        # an open file holds a new chunk when the stop comes: SIGTERM must commit it
        new = (np.arange(8 * 16, dtype="uint16").reshape(8, 16) + 500).astype("uint16")
        made = tmp_path / "new.tif"
        tifffile.imwrite(made, new)
        f = open(mnt / "c" / "1" / "0.tiff", "r+b")
        f.truncate(0)
        f.write(made.read_bytes())
        f.flush()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        msg = receive(sock, timeout=30)
        assert msg.get("STOPPING") == "1", msg
        assert proc.wait(timeout=30) == 0, (tmp_path / "daemon.log").read_text()
        assert time.monotonic() - t0 < 30
        assert not os.path.ismount(mnt)
        try:
            f.close()
        except OSError:
            pass  # the filesystem is gone under the open file
        np.testing.assert_array_equal(zarr.open_array(str(src))[8:16, 0:16], new)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
