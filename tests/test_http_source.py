"""https:// and http:// sources: read-only mounts through zarr's fsspec store.

A real HTTP server (Python's http.server, loopback only) serves a store
directory; its directory pages are what fsspec lists.
"""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile

import stores
from test_mount_read import expected_chunk

pytestmark = pytest.mark.mount


def serve(root: Path) -> tuple[subprocess.Popen, int]:
    """Python's http.server serving `root` on a free loopback port, once it accepts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.05)


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "www"
    root.mkdir()
    server, port = serve(root)
    try:
        yield root, f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_http_source_reads_and_is_read_only(http_root: tuple[Path, str], mount) -> None:
    """[ns-8] an http(s) source is mounted read-only; every chunk reads as the source's."""
    root, url = http_root
    stores.v3(root / "a.zarr")
    m = mount(f"{url}/a.zarr")
    arr = stores.open_any(root / "a.zarr")
    files = sorted(m.path.rglob("*.tiff"))
    assert len(files) == 6
    for f in files:
        i, j = int(f.parent.name), int(f.stem)
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(arr, (i, j)))
    with pytest.raises(OSError) as e:
        (m.path / "c" / "0" / "0.tiff").write_bytes(b"x")
    assert e.value.errno == errno.EROFS


def test_a_sharded_array_from_a_server_without_ranges(http_root: tuple[Path, str], mount) -> None:
    """[remote-8] Python's http.server answers a GET with a Range header with the whole
    file (200): each inner chunk and shard index is taken from the body as it streams,
    and every chunk file reads as the source's."""
    root, url = http_root
    stores.sharded(root / "s.zarr", shape=(40, 60), shards=(32, 32), chunks=(8, 16))
    m = mount(f"{url}/s.zarr")
    arr = stores.open_any(root / "s.zarr")
    files = sorted(m.path.rglob("*.tiff"))
    assert len(files) == 5 * 4
    for f in files:
        i, j = int(f.parent.name), int(f.stem)
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(arr, (i, j)))
    assert "Traceback" not in m.log()


def test_an_http_server_gone_or_silent_is_found_unreachable(tmp_path: Path) -> None:
    """[read-12] an http(s) store whose server is gone (connections refused) or drops
    connections silently (a connect timeout): EREMOTEIO naming the request and why, not
    a bare aiohttp error; every request then fails at once for a while."""
    import aiohttp

    from zfuse.daemon import MountConfig
    from zfuse.errors import StoreServerError
    from zfuse.open_view import make_view

    stores.v3(tmp_path / "www" / "a.zarr")
    for how in ("refused", "silent"):
        server, port = serve(tmp_path / "www")
        hole = filler = None
        try:
            options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=300, sock_connect=0.5)}}
            view = make_view(MountConfig([f"http://127.0.0.1:{port}/a.zarr"], "/nonexistent", read_only=True,
                                         storage_options=options))
            arr = dict(view.arrays())[()]
            assert bytes(arr.pixel_bytes((0, 0)))
            server.terminate()
            server.wait(timeout=10)
            if how == "silent":  # the port open, no connection ever completing
                hole = socket.socket()
                hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                hole.bind(("127.0.0.1", port))
                hole.listen(0)
                filler = socket.create_connection(("127.0.0.1", port), timeout=5)
            start = time.monotonic()
            with pytest.raises(StoreServerError, match=r"store request get c/1/1 failed after [\d.]+ s") as e:
                arr.pixel_bytes((1, 1))
            assert time.monotonic() - start < 10, how
            assert e.value.errno in (errno.ECONNREFUSED, errno.EREMOTEIO), (how, e.value.errno)
            start = time.monotonic()
            with pytest.raises(StoreServerError, match="every request to the store fails at once"):
                arr.pixel_bytes((1, 0))
            assert time.monotonic() - start < 1.0, how
        finally:
            server.kill()
            for sock in (hole, filler):
                if sock is not None:
                    sock.close()


def test_reads_waiting_on_a_slow_store_leave_listings_their_threads(tmp_path: Path, mount) -> None:
    """[read-11] eight reads of chunk files whose objects the server holds (it answers
    nothing for them yet) fill the read threads only: a directory of another array is
    listed, and its chunk file looked up, meanwhile (they had waited for one of the same
    threads: `ls` took 11 s against a slow server)."""
    import http.server
    import os
    import threading

    root = tmp_path / "www"
    for name in ("a", "b"):
        a = stores.zarr.create_array(str(root / "s.zarr" / name), shape=(64, 64), chunks=(8, 8), dtype="u1",
                                     fill_value=0)
        a[...] = 1
    stores.zarr.open_group(str(root / "s.zarr"), mode="a")
    release = threading.Event()
    held: list[str] = []

    class Holding(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.startswith("/s.zarr/a/c/") and (root / self.path.lstrip("/")).is_file():
                held.append(self.path)
                release.wait(60)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **kw: Holding(*a, directory=str(root),
                                                                                       **kw))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    readers: list[threading.Thread] = []
    try:
        m = mount(f"http://127.0.0.1:{server.server_address[1]}/s.zarr", "-o", "timeout=90")
        files = [m.path / "a" / "c" / str(i) / "0.tiff" for i in range(8)]
        for f in files:
            os.listdir(f.parent)  # (their directories listed, as `ls` or a walker does: answered)
        readers = [threading.Thread(target=f.read_bytes, daemon=True) for f in files]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 30
        while len(set(held)) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(set(held)) >= 8, held
        listed: list[str] = []
        lister = threading.Thread(target=lambda: listed.extend(os.listdir(m.path / "b" / "c" / "3")), daemon=True)
        lister.start()
        lister.join(20)
        assert sorted(listed) == [f"{j}.tiff" for j in range(8)], "the listing waited for the reads"
        assert not release.is_set() and all(t.is_alive() for t in readers)  # (still held meanwhile)
    finally:
        release.set()
        for t in readers:
            t.join(30)
        server.shutdown()
        server.server_close()
