"""A store that does not answer: bounded waits, shared timeouts, messages and counters.

FUSE-free tests call `zfuse.store.MeteredStore` over `zfuse.testing.FaultyStore` (hangs
are asyncio sleeps, cancellable as a real request in flight). The mount tests serve a
store over HTTP from a thread of this process; the server can be switched to hang:
it accepts each connection and reads the request, then never answers (until the
test ends), as a hung server does.
"""

from __future__ import annotations

import asyncio
import errno
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from zfuse.errors import StoreTimeoutError
from zfuse.stats import Stats
from zfuse.store import (
    DEFAULT_REMOTE_TIMEOUT,
    FAILED_RECENTLY_S,
    MeteredStore,
    default_timeout,
)
from zfuse.testing import Fault, FaultyStore, wait_until

import stores

PROTO = default_buffer_prototype()


# -- FUSE-free: the rule lives in MeteredStore -----------------------------------------

def test_default_timeout_is_for_remote_sources_only() -> None:
    assert DEFAULT_REMOTE_TIMEOUT == 20.0
    for remote in ("https://host/a.zarr", "http://h/a", "s3://bucket/a.zarr", "gs://b/a", "memory://x"):
        assert default_timeout(remote, None) == DEFAULT_REMOTE_TIMEOUT
    assert default_timeout("/data/a.zarr", None) is None
    assert default_timeout("file:///data/a.zarr", None) is None
    assert default_timeout("s3://b/a", 5.0) == 5.0
    assert default_timeout("/data/a.zarr", 3.0) == 3.0
    assert default_timeout("s3://b/a", 0.0) is None  # timeout=0: none


def _metered(tmp_path: Path, *faults: Fault, timeout: float = 0.3) -> tuple[MeteredStore, FaultyStore, Stats]:
    stores.v3(tmp_path / "a.zarr")
    faulty = FaultyStore(LocalStore(str(tmp_path / "a.zarr"), read_only=True), faults)
    stats = Stats()
    return MeteredStore(faulty, stats, timeout, source="https://user:secret@host/a.zarr"), faulty, stats


def test_a_timeout_names_request_key_wait_and_store(tmp_path: Path) -> None:
    """[read-11] the reason is never empty: request, key, the wait, the store (no credentials)."""
    store, faulty, stats = _metered(tmp_path, Fault("hang", pattern="c/0/0"))

    async def run() -> None:
        with pytest.raises(StoreTimeoutError) as e:
            await store.get("c/0/0", PROTO)
        assert str(e.value) == "store request get c/0/0 timed out after 0.3 s (https://host/a.zarr)"
        assert await store.get("c/0/1", PROTO) is not None  # other keys: asked as usual

    asyncio.run(run())
    assert stats.snapshot()["store_timeouts"] == 1
    assert stats.snapshot()["store_requests_in_flight"] == 0
    faulty.release()


def test_a_key_that_timed_out_fails_at_once_then_is_asked_again(tmp_path: Path) -> None:
    """[read-11] after a timeout, requests for the same key (get or exists) fail at once with
    the same reason, without reaching the store; `StoreFailures.forget` (a new open of the file)
    or FAILED_RECENTLY_S later, the store is asked again."""
    store, faulty, stats = _metered(tmp_path, Fault("hang", pattern="c/1/0", ops=("get", "exists")))

    async def run() -> None:
        with pytest.raises(StoreTimeoutError):
            await store.get("c/1/0", PROTO)
        asked = len(faulty.requests)
        start = time.monotonic()
        for request in (store.get("c/1/0", PROTO), store.exists("c/1/0"), store.get("c/1/0", PROTO)):
            with pytest.raises(StoreTimeoutError, match=r"get c/1/0 timed out after 0.3 s .* ago: .* fails at once"):
                await request
        assert time.monotonic() - start < 0.2
        assert len(faulty.requests) == asked  # none reached the store
        faulty.set_faults([])
        store.failures.forget("c/1/0")
        assert await store.get("c/1/0", PROTO) is not None

    asyncio.run(run())
    snap = stats.snapshot()
    assert snap["store_timeouts"] == 1 and snap["store_failed_fast"] == 3
    assert FAILED_RECENTLY_S <= 10


def test_requests_under_way_for_a_key_give_up_with_its_timeout(tmp_path: Path) -> None:
    """[read-11] a request for a key started while another for it waits gives up when that one
    times out (shares its outcome), rather than waiting out its own timeout."""
    store, faulty, stats = _metered(tmp_path, Fault("hang", pattern="c/1/1", ops=("get", "exists")), timeout=1.0)

    async def late() -> float:
        await asyncio.sleep(0.6)
        start = time.monotonic()
        with pytest.raises(StoreTimeoutError, match="get c/1/1 timed out after 1 s"):
            await store.exists("c/1/1")
        return time.monotonic() - start

    async def run() -> float:
        first = asyncio.ensure_future(store.get("c/1/1", PROTO))
        waited = await late()
        with pytest.raises(StoreTimeoutError):
            await first
        return waited

    waited = asyncio.run(run())
    assert waited < 0.8, waited  # its own timeout would be 1 s
    assert stats.snapshot()["store_timeouts"] == 1
    faulty.release()


def test_a_hung_listing_times_out(tmp_path: Path) -> None:
    """[read-11] each page of a listing is bounded too."""
    store, faulty, stats = _metered(tmp_path, Fault("hang", pattern="c/1/*", ops=("list",)))

    async def run() -> None:
        with pytest.raises(StoreTimeoutError, match=r"store request list_dir c/1/ timed out after 0.3 s"):
            async for _ in store.list_dir("c/1/"):
                pass
        assert sorted([k async for k in store.list_dir("c/0/")]) == ["0", "1"]

    asyncio.run(run())
    assert stats.snapshot()["store_timeouts"] == 1
    faulty.release()


class _SilentTimeout(TimeoutError):
    pass


def test_the_stores_own_timeout_gets_a_reason(tmp_path: Path) -> None:
    """[read-11] aiohttp's TimeoutError says nothing: the message names the request anyway."""
    store, _, stats = _metered(tmp_path, Fault("error", pattern="c/0/0", exception=_SilentTimeout()), timeout=0)
    assert store.timeout is None

    async def run() -> None:
        with pytest.raises(StoreTimeoutError, match=r"^store request get c/0/0 timed out after .* s "
                           r"\(the store's own timeout\) \(https://host/a.zarr\)$"):
            await store.get("c/0/0", PROTO)

    asyncio.run(run())
    assert stats.snapshot()["store_timeouts"] == 1


def test_requests_in_flight_and_errors_are_counted(tmp_path: Path) -> None:
    """[read-11] `store_requests_in_flight` and `store_oldest_request_s` show a request under
    way; a failed request counts in `store_errors`."""
    store, faulty, stats = _metered(tmp_path, Fault("hang", pattern="c/0/0"), Fault("error", pattern="c/0/1"),
                                    timeout=5.0)

    async def run() -> dict:
        task = asyncio.ensure_future(store.get("c/0/0", PROTO))
        await asyncio.sleep(0.5)
        snap = stats.snapshot()
        with pytest.raises(OSError):
            await store.get("c/0/1", PROTO)
        faulty.release()
        assert await task is not None
        return snap

    during = asyncio.run(run())
    assert during["store_requests_in_flight"] == 1 and during["store_oldest_request_s"] >= 0.4
    after = stats.snapshot()
    assert after["store_requests_in_flight"] == 0 and after["store_oldest_request_s"] == 0
    assert after["store_errors"] == 1 and "store_timeouts" not in after


# -- real mounts: an HTTP server that stops answering ----------------------------------

@dataclass
class HangingServer:
    url: str
    root: Path
    hang: threading.Event
    release: threading.Event


@pytest.fixture
def hanging_http(tmp_path: Path) -> Iterator[HangingServer]:
    """An HTTP server of tmp_path/www in a thread; once `hang` is set it accepts each
    connection, reads the request and never answers (until the test ends: bounded)."""
    root = tmp_path / "www"
    root.mkdir()
    hang, release = threading.Event(), threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if hang.is_set():
                release.wait(120)
                return
            super().do_GET()

        def do_HEAD(self) -> None:
            if hang.is_set():
                release.wait(120)
                return
            super().do_HEAD()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield HangingServer(f"http://127.0.0.1:{server.server_address[1]}", root, hang, release)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


READ_IN_CHILD = """
import os, sys, time
start = time.monotonic()
try:
    with open(sys.argv[1], "rb") as f:
        f.read()
    print("ok", time.monotonic() - start)
except OSError as e:
    print(os.strerror(e.errno), time.monotonic() - start)
"""


def _read_in_child(path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", READ_IN_CHILD, str(path)], stdout=subprocess.PIPE, text=True)


def _stats(m) -> dict:
    """.zfuse/stats read in a child with a bound (a hung daemon fails the test, never hangs it)."""
    out = subprocess.run([sys.executable, "-c", "import sys; print(open(sys.argv[1]).read())",
                          str(m.path / ".zfuse" / "stats")], capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout)


@pytest.mark.mount
def test_a_hung_http_server_fails_a_read_within_one_timeout(hanging_http: HangingServer, mount) -> None:
    """[read-11] an http source whose server stops answering: a chunk read fails with EIO after
    about one `-o timeout` (not one per request of the read), the log line names the request,
    the key and the wait; `.zfuse/stats` and `zfuse status` count the timeout and show the
    request in flight meanwhile; a SIGKILLed reader is gone at once; a reopen asks again."""
    timeout = 2.0
    stores.v3(hanging_http.root / "a.zarr")
    m = mount(f"{hanging_http.url}/a.zarr", "-o", f"timeout={timeout:g}")
    assert sorted(os.listdir(m.path / "c" / "1")) == ["0.tiff", "1.tiff"]  # lookups from the listing
    hanging_http.hang.set()

    child = _read_in_child(m.path / "c" / "1" / "1.tiff")
    wait_until(lambda: _stats(m)["store_requests_in_flight"] >= 1, timeout=10, what="the read to reach the store")
    snap = _stats(m)  # the daemon answers meanwhile
    assert snap["store_oldest_request_s"] < timeout + 1
    out, _ = child.communicate(timeout=4 * timeout + 5)
    outcome, seconds = out.rsplit(" ", 1)
    assert outcome == "Input/output error", out
    assert float(seconds) < 2 * timeout + 1.5, out  # one timeout (plus the lookup's), not six
    log = m.log()
    line = next(li for li in log.splitlines() if "c/1/1.tiff" in li and "ERROR" in li)
    assert re.search(r"store request (get|exists) c/1/1 timed out after 2 s \(http://127\.0\.0\.1:\d+/a\.zarr\)", line), line
    assert _stats(m)["store_timeouts"] >= 1
    status = subprocess.run([sys.executable, "-m", "zfuse.cli", "status", str(m.path), "--json"],
                            capture_output=True, text=True, timeout=30)
    (item,) = json.loads(status.stdout)
    assert item["stats"]["store_timeouts"] >= 1 and "store_requests_in_flight" in item["stats"]

    # a reader killed while it waits is gone at once, not when the store answers
    child = _read_in_child(m.path / "c" / "0" / "1.tiff")
    wait_until(lambda: _stats(m)["store_requests_in_flight"] >= 1, timeout=10, what="the read to reach the store")
    start = time.monotonic()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=4 * timeout + 5)
    assert time.monotonic() - start < 2 * timeout + 1.5

    # the server answers again: a new open asks the store again and reads
    hanging_http.hang.clear()
    hanging_http.release.set()
    assert (m.path / "c" / "1" / "1.tiff").read_bytes()[:2] == b"II"


@pytest.mark.mount
def test_with_no_option_a_hung_server_costs_a_reader_one_default_timeout(hanging_http: HangingServer, mount) -> None:
    """[read-11] no `-o timeout`: a remote source's default bounds the read (20 s; was 5 min)."""
    stores.v3(hanging_http.root / "a.zarr")
    m = mount(f"{hanging_http.url}/a.zarr")
    os.listdir(m.path / "c" / "0")
    hanging_http.hang.set()
    child = _read_in_child(m.path / "c" / "0" / "0.tiff")
    out, _ = child.communicate(timeout=75)
    outcome, seconds = out.rsplit(" ", 1)
    assert outcome == "Input/output error", out
    assert DEFAULT_REMOTE_TIMEOUT - 1 < float(seconds) < DEFAULT_REMOTE_TIMEOUT + 10, out
    assert f"timed out after {DEFAULT_REMOTE_TIMEOUT:g} s" in m.log()


def test_zfuse_status_says_how_the_store_answers() -> None:
    """[read-11] `zfuse status` has a store line once a request is in flight or failed."""
    from zfuse.mounts import format_status, store_health

    assert store_health({"store_get_chunk": 5, "store_requests_in_flight": 0}) == ""
    line = store_health({"store_requests_in_flight": 2, "store_oldest_request_s": 13.2, "store_timeouts": 3,
                         "store_failed_fast": 4, "store_errors": 1})
    assert line == "2 requests in flight (oldest 13.2 s), 3 timed out (4 more failed at once), 1 other error"
    item = {"mountpoint": "/m", "state": "running", "source": "s3://b/a", "pid": 1, "uptime_s": 5,
            "stats": {"store_timeouts": 1}}
    assert "  store   0 requests in flight, 1 timed out, 0 other errors" in format_status([item]).splitlines()


def test_a_failure_with_no_message_is_logged_with_a_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """[read-11] an exception whose text is empty (aiohttp's TimeoutError) still gives the log
    line and `.zfuse/errors` a reason: its type, the operation and the store key."""
    from test_fs import Clock, make_fs

    stores.v3(tmp_path / "a.zarr")
    fs, _ = make_fs(tmp_path / "a.zarr", Clock())
    with caplog.at_level("ERROR", logger="zfuse.fs"):
        fs.fail(TimeoutError(), "lookup", ("c", "0", "1.tiff"))
    (record,) = [r for r in caplog.records if r.name == "zfuse.fs"]
    assert "lookup c/0/1.tiff [store key c/0/1]: TimeoutError (no message) in lookup of store key c/0/1 (EIO)" \
        == record.getMessage()
    assert fs.errors[-1].endswith("TimeoutError (no message) in lookup of store key c/0/1 (EIO)")


@pytest.mark.mount
def test_mounting_a_server_that_never_answers_fails_within_the_timeout(tmp_path: Path) -> None:
    """[read-11] a server that accepts connections and never answers: `zfuse mount` fails
    after the timeout, saying which request timed out (a socket and a thread, no HTTP)."""
    conns: list = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    conns.append(listener.accept()[0])
                except OSError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        (tmp_path / "mnt").mkdir()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/a.zarr"
        start = time.monotonic()
        try:
            result = subprocess.run([sys.executable, "-m", "zfuse.cli", "mount", url, str(tmp_path / "mnt"), "-f",
                                     "-o", "timeout=1"], capture_output=True, text=True, timeout=60)
        finally:
            stop.set()
            thread.join(5)
            for c in conns:
                c.close()
    assert result.returncode != 0
    assert time.monotonic() - start < 4 * 1 + 5
    assert f"store request get zarr.json timed out after 1 s ({url})" in result.stderr, result.stderr
    assert conns  # it did connect: the server accepted and said nothing


def test_a_chunk_asked_again_asks_for_its_shard_again(tmp_path: Path) -> None:
    """[read-11] a chunk file opened anew after its shard's request timed out: the shard is
    asked again at once (the chunk's source forgets the key that failed, its shard's:
    forgetting the inner chunk's name left the shard failing at once for 5 s), and a
    timed-out shard index is a timeout, not a corrupt index."""
    from zarr.storage import LocalStore

    from zfuse.view.array_view import ArrayView, ChunkCache, ViewOptions
    from zfuse.view.source import ZarrChunkSource

    stores.sharded(tmp_path / "s.zarr", shape=(16, 16), shards=(8, 8), chunks=(2, 2))
    faulty = FaultyStore(LocalStore(str(tmp_path / "s.zarr"), read_only=True),
                         [Fault("hang", pattern="c/1/0", ops=("get", "exists", "getsize"))])
    store = MeteredStore(faulty, Stats(), 0.3, source="https://host/s.zarr")
    import zarr

    arr = ArrayView(ZarrChunkSource(zarr.open_array(store, mode="r")), ViewOptions(), ChunkCache(1 << 20))
    with pytest.raises(StoreTimeoutError, match="c/1/0 timed out"):
        arr.exists((5, 1))  # (an inner chunk of shard (1, 0))
    faulty.set_faults([])
    with pytest.raises(StoreTimeoutError, match="fails at once"):
        arr.exists((5, 1))
    arr.source.retry_failed((5, 1))
    assert arr.exists((5, 1))
    faulty.release()


def test_stores_keep_their_failures_apart_and_copies_share_them(tmp_path: Path) -> None:
    """[read-11] a key failing on one store fails at once on that store and its copies
    (zarr's read-only copy of a store), never on another store of the process (another
    mount, another source of a concatenation)."""
    one, faulty, _ = _metered(tmp_path / "1", Fault("hang", pattern="c/0/0"))
    other, _, _ = _metered(tmp_path / "2")
    copy = one.with_read_only(True)

    async def run() -> None:
        with pytest.raises(StoreTimeoutError):
            await one.get("c/0/0", PROTO)
        with pytest.raises(StoreTimeoutError, match="fails at once"):
            await copy.get("c/0/0", PROTO)
        assert await other.get("c/0/0", PROTO) is not None
        assert one.failures.pending() and not other.failures.pending()

    asyncio.run(run())
    faulty.release()


def test_a_listing_that_never_ends_is_stopped(monkeypatch) -> None:
    """[read-11] every page of a listing comes at once, but the pages never end (a server
    sending a new continuation token each time): the whole listing is bounded too, at
    LISTING_TIMEOUTS timeouts (at least LISTING_MIN_S), naming it and the keys read
    (`ls` went on for ever once each page was bounded on its own)."""
    import zfuse.store as store_module

    class Endless(LocalStore):
        async def list_dir(self, prefix: str):  # type: ignore[override]
            n = 0
            while True:
                n += 1
                if not n % 500:
                    await asyncio.sleep(0)  # (a page arrives)
                yield f"k{n}"

    monkeypatch.setattr(store_module, "LISTING_TIMEOUTS", 1)
    monkeypatch.setattr(store_module, "LISTING_MIN_S", 0.3)
    store = MeteredStore(Endless("/nonexistent", read_only=True), Stats(), 0.3, source="s3://b/a.zarr")

    async def run() -> int:
        got = 0
        with pytest.raises(StoreTimeoutError, match=r"store listing list_dir c/ still going after 0.3 s and \d+ keys"):
            async for _ in store.list_dir("c/"):
                got += 1
        return got

    assert asyncio.run(run()) > 0


def test_aiohttp_connection_failures_of_every_kind_are_remote_errors() -> None:
    """[read-12] an http(s) store's connection failures, DNS's included (aiohttp's
    ClientConnectorDNSError, a kind of ClientConnectorError, with the resolver's negative
    code -2): EREMOTEIO or the failure's own errno, never a negative one, and the store
    is marked unreachable (the DNS failure was a bare aiohttp error, errno -2)."""
    import socket
    import types

    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey

    from zfuse import store as store_module
    from zfuse.errors import StoreServerError, errno_for

    key = ConnectionKey("data.example.org", 443, True, True, None, None, None)
    for exc, code in ((aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused")), 111),
                      (aiohttp.ClientConnectorDNSError(key, socket.gaierror(-2, "Name or service not known")),
                       errno.EREMOTEIO)):
        metered = types.SimpleNamespace(stats=Stats(), failures=store_module.StoreFailures(),
                                        source="https://data.example.org/a.zarr")
        with pytest.raises(StoreServerError) as e:
            store_module.MeteredStore._raise_failed(metered, exc, "get", "c/1/1", time.monotonic(), None)
        assert errno_for(e.value) == code
        assert metered.failures.recent("c/0/0") is not None  # (every request: the store unreachable)
    assert errno_for(socket.gaierror(-2, "Name or service not known")) == errno.EIO
