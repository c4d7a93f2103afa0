"""A hostile or broken remote server (FUSE-free: the view over a real server on
loopback): what a response holds is bounded by what its reader can use.

- S3 (moto): a chunk object larger than its chunk can be stored in is refused from its
  Content-Length, unread; a `zarr.json` past the 16 MiB zfuse reads is refused at that
  bound; a LIST page botocore reads whole is read to at most 16 MiB.
- S3 failing (a proxy in front of moto answering one object's GETs with a 500 or a
  503): the error says what the server answered to how many tries, the key fails at
  once for a while after (not the retries again per read()); a server gone says so.
- http(s) (a server written here): a chunk whose body never ends is read to the chunk's
  bound and refused; a body the server gzips although zfuse asked for it as stored
  (Accept-Encoding: identity) is decoded to that bound, never further (a 6 MB gzip of
  zeros was gigabytes).
"""

from __future__ import annotations

import errno
import gzip
import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from test_s3 import upload

from zfuse.daemon import MountConfig
from zfuse.errors import CorruptDataError, StoreServerError, StoreTimeoutError
from zfuse.open_view import make_view
from zfuse.remote_objects import NON_STREAMING_MAX, bound_non_streaming_responses
from zfuse.stats import Stats

from s3server import FailingProxy, S3Server


def _store(root: Path) -> Path:
    """A group with one small zstd array `a` (16 x 16 uint8, 8 x 8 chunks): chunks are
    stored in at most 2 x 64 bytes + 1 MiB."""
    zarr.open_group(str(root), mode="w")
    a = zarr.create_array(str(root / "a"), shape=(16, 16), chunks=(8, 8), dtype="u1", fill_value=0)
    a[...] = np.arange(256, dtype="u1").reshape(16, 16)
    return root


# -- S3 ------------------------------------------------------------------------------


def test_s3_objects_past_what_they_can_hold_are_refused_unread(tmp_path: Path, s3: S3Server) -> None:
    root = _store(tmp_path / "s.zarr")
    (root / "a" / "c" / "1" / "1").write_bytes(bytes(3 * 2**20))  # 3 MB for a 64-byte chunk
    (root / "big").mkdir()
    (root / "big" / "zarr.json").write_bytes(b'{"x": "' + b"a" * (17 * 2**20) + b'"}')
    upload(s3, root, "hostile", "s.zarr")
    before = len(s3.requests())
    view = make_view(MountConfig(["s3://hostile/s.zarr"], "/nonexistent", read_only=True,
                                 storage_options=s3.storage_options))
    view.list_dir(())  # (a remote group's members are opened when first looked at)
    arrays = dict(view.arrays())
    assert bytes(arrays[("a",)].pixel_bytes((0, 1))) == np.arange(256, dtype="u1").reshape(16, 16)[:8, 8:].tobytes()
    with pytest.raises(CorruptDataError, match=r"a/c/1/1: the server sent more than 1048704 bytes"):
        arrays[("a",)].pixel_bytes((1, 1))
    why = {p.path: p.reason for p in view.problems}
    assert "more than 16777217 bytes" in why["big"]
    assert all(r.status < 500 for r in s3.requests()[before:])


def _failing_view(tmp_path: Path, s3: S3Server, bucket: str, status: int, code: str,
                  timeout: float | None = None) -> tuple[object, FailingProxy, Stats]:
    """A view of `_store` on S3 through a proxy failing every GET of `a/c/1/1`, botocore
    trying each request 4 times (3 retries, legacy backoff)."""
    upload(s3, _store(tmp_path / "s.zarr"), bucket, "s.zarr")
    proxy = FailingProxy(s3, "/a/c/1/1", status, code)
    options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url,
               "config_kwargs": {"retries": {"max_attempts": 3, "mode": "legacy"}}}
    stats = Stats()
    view = make_view(MountConfig([f"s3://{bucket}/s.zarr"], "/nonexistent", read_only=True,
                                 storage_options=options, timeout=timeout), stats)
    view.list_dir(())
    return dict(view.arrays())[("a",)], proxy, stats


def test_a_server_failing_an_object_says_what_it_answered_and_is_not_asked_again_at_once(
        tmp_path: Path, s3: S3Server) -> None:
    """[read-12] a 500 on every try: EREMOTEIO naming the request, the key, the server's
    answer and the tries; the next read of the key fails at once (before: each read()
    waited out botocore's retries again), other keys are read as usual."""
    arr, proxy, stats = _failing_view(tmp_path, s3, "fails500", 500, "InternalError")
    try:
        with pytest.raises(StoreServerError) as e:
            arr.pixel_bytes((1, 1))
        assert e.value.errno == errno.EREMOTEIO
        said = re.fullmatch(r"store request get a/c/1/1 failed after [\d.]+ s: failing on purpose; the server "
                            r"answered 500 InternalError to (\d+) tries \(s3://fails500/s.zarr\)", e.value.strerror)
        assert said is not None and int(said[1]) == proxy.failed >= 3
        tries = proxy.failed
        with pytest.raises(StoreServerError, match=r"500 InternalError to \d+ tries .* ago: get of the same key fails at once"):
            arr.pixel_bytes((1, 1))
        assert proxy.failed == tries  # (not asked again)
        assert bytes(arr.pixel_bytes((0, 0)))[:2] == bytes([0, 1])
        assert stats.snapshot()["store_failed_tries"] == tries
    finally:
        proxy.close()


def test_a_server_throttling_past_the_timeout_is_no_silence(tmp_path: Path, s3: S3Server) -> None:
    """[read-12] 503 SlowDown on every try, retried (by botocore, then s3fs) past the
    timeout: the timeout's message says what the server answered meanwhile."""
    arr, proxy, _ = _failing_view(tmp_path, s3, "fails503", 503, "SlowDown", timeout=2.0)
    try:
        with pytest.raises(StoreTimeoutError, match=r"^store request get a/c/1/1 timed out after 2 s: the server "
                                                    r"answered 503 SlowDown to \d+ tries \(s3://fails503/s.zarr\)$"):
            arr.pixel_bytes((1, 1))
    finally:
        proxy.close()


def test_a_server_gone_says_it_gave_no_answer(tmp_path: Path, s3: S3Server) -> None:
    """[read-12] connections refused after the mount opened (the endpoint gone): EREMOTEIO
    saying the tries got no answer, and why; every request to that store then fails at
    once for 5 s, not only that key's."""
    arr, proxy, _ = _failing_view(tmp_path, s3, "gone", 500, "InternalError")
    proxy.gone()
    with pytest.raises(StoreServerError, match=r"store request get a/c/1/1 failed after [\d.]+ s: .*; no answer "
                                               r"to \d+ tries \(EndpointConnectionError\) \(s3://gone/s.zarr\)"):
        arr.pixel_bytes((1, 1))
    # the store itself is unreachable: other keys fail at once for a while too (each new
    # key cost the whole retry cycle: a cat of 8 files took 61 s)
    start = time.monotonic()
    with pytest.raises(StoreServerError, match=r"no answer to \d+ tries .* ago: every request to the store fails at once"):
        arr.pixel_bytes((1, 0))
    assert time.monotonic() - start < 1.0


def test_a_server_dropping_connections_silently_is_found_unreachable(tmp_path: Path, s3: S3Server) -> None:
    """[read-12] an endpoint that stops answering without refusing (a firewall dropping
    packets): each try's connection times out (zfuse sets botocore's connect timeout;
    its own 60 s outlasted the request's whole timeout, so each key cost 20 s and the
    store was never found unreachable); then every request fails at once."""
    upload(s3, _store(tmp_path / "s.zarr"), "silent", "s.zarr")
    proxy = FailingProxy(s3, "/none", 500, "InternalError")
    options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url, "config_kwargs": {"connect_timeout": 0.5}}
    view = make_view(MountConfig(["s3://silent/s.zarr"], "/nonexistent", read_only=True, storage_options=options))
    view.list_dir(())
    arr = dict(view.arrays())[("a",)]
    try:
        proxy.silent()
        start = time.monotonic()
        with pytest.raises(StoreServerError, match=r"store request get a/c/1/1 failed after [\d.]+ s: .*no answer "
                                                   r"to 3 tries \(ConnectTimeoutError\)"):
            arr.pixel_bytes((1, 1))
        assert time.monotonic() - start < 10  # (3 tries of 0.5 s and botocore's backoffs)
        start = time.monotonic()
        with pytest.raises(StoreServerError, match="every request to the store fails at once"):
            arr.pixel_bytes((1, 0))
        assert time.monotonic() - start < 1.0
    finally:
        proxy.black_hole.close()
        proxy.filler.close()


def test_a_store_found_unreachable_slowly_is_left_as_long() -> None:
    """[read-12] a store that took T seconds to find unreachable (connect timeouts) fails
    every request at once for T (at least 5 s), and a file opened anew asks it again
    after T (at least 1 s): each file opened asked again, each costing T."""
    import zfuse.store as store_module

    now = [100.0]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    failures = store_module.StoreFailures()
    error = StoreServerError("store request get k failed: no answer to 3 tries (ConnectTimeoutError)")
    original = store_module.time
    store_module.time = Clock  # type: ignore[assignment]
    try:
        failures.note_down(error, cost=12.0)
        now[0] += 6.0
        failures.forget("k")  # (a file opened anew: too soon to ask the store again)
        assert failures.recent("k") is not None and failures.pending()
        now[0] += 6.5
        failures.forget("k")
        assert failures.recent("k") is None
        failures.note_down(error, cost=0.2)  # (refused at once: 5 s, asked again after 1 s)
        now[0] += 1.5
        assert failures.recent("other") is not None
        failures.forget("other")
        assert failures.recent("other") is None
    finally:
        store_module.time = original


def test_an_s3_redirect_to_another_host_is_not_followed(tmp_path: Path, s3: S3Server) -> None:
    """[outside-1] an S3 endpoint answering a chunk's GET with a redirect to another host:
    the other host's bytes are never the chunk (aiohttp followed it, and the chunk file
    showed them), and the other host is never asked (aiohttp still sent it the request,
    whose answer was then thrown away); the read fails EREMOTEIO, saying where the
    redirect went."""
    asked: list[str] = []

    class Other(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "64")
            self.end_headers()
            self.wfile.write(b"A" * 64)

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    upload(s3, _store(tmp_path / "s.zarr"), "redirects", "s.zarr")
    proxy = FailingProxy(s3, "/a/c/1/1", 307, "TemporaryRedirect",
                         location=f"http://127.0.0.1:{other.server_address[1]}/internal/secret")
    options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url,
               "config_kwargs": {"retries": {"max_attempts": 1, "mode": "legacy"}}}
    try:
        view = make_view(MountConfig(["s3://redirects/s.zarr"], "/nonexistent", read_only=True,
                                     storage_options=options))
        view.list_dir(())
        with pytest.raises(OSError, match=r"c/1/1: the server redirected it to http://127.0.0.1:\d+/internal/"
                                          r"secret: not followed") as refused:
            dict(view.arrays())[("a",)].pixel_bytes((1, 1))
        assert refused.value.errno == errno.EREMOTEIO
        assert asked == []
    finally:
        proxy.close()
        other.shutdown()


def test_an_s3_redirect_to_a_dead_host_fails_that_key_only(tmp_path: Path, s3: S3Server) -> None:
    """[read-12] one object's GET redirected to a host that does not answer: that read
    fails saying where it was sent, and the store is not taken for unreachable (every
    key of every array had failed at once for 5 s, named as the store's own endpoint)."""
    upload(s3, _store(tmp_path / "s.zarr"), "deadredirect", "s.zarr")
    proxy = FailingProxy(s3, "/a/c/1/1", 307, "TemporaryRedirect", location="http://127.0.0.1:1/x")
    options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url,
               "config_kwargs": {"retries": {"max_attempts": 1, "mode": "legacy"}}}
    try:
        view = make_view(MountConfig(["s3://deadredirect/s.zarr"], "/nonexistent", read_only=True,
                                     storage_options=options))
        view.list_dir(())
        array = dict(view.arrays())[("a",)]
        with pytest.raises(OSError, match=r"redirected it to http://127.0.0.1:1/x: not followed"):
            array.pixel_bytes((1, 1))
        assert bytes(array.pixel_bytes((0, 0))) == np.arange(256, dtype="u1").reshape(16, 16)[:8, :8].tobytes()
    finally:
        proxy.close()


def test_a_key_that_is_also_a_prefix_is_listed_once(tmp_path: Path, s3: S3Server) -> None:
    """A chunk key that is also a prefix (`c/0/1` and a leftover `c/0/1/stray`): its
    directory lists `1.tiff` once (readdir had given it twice)."""
    upload(s3, _store(tmp_path / "s.zarr"), "dupnames", "s.zarr")
    s3.client.put_object(Bucket="dupnames", Key="s.zarr/a/c/0/1/stray", Body=b"x")
    view = make_view(MountConfig(["s3://dupnames/s.zarr"], "/nonexistent", read_only=True,
                                 storage_options=s3.storage_options))
    view.list_dir(())
    assert sorted(name for name, _ in view.list_dir(("a", "c", "0"))) == ["0.tiff", "1.tiff"]


class _HugeAnswers(http.server.BaseHTTPRequestHandler):
    """An "S3" answering a LIST with a 17 MiB page (Content-Length given), and any other
    request with a 404 of 40 MiB (no Content-Length: the body ends with the connection)."""

    protocol_version = "HTTP/1.0"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if "list-type=2" in self.path:
            body = b"<ListBucketResult>" + b"<Contents><Key>k</Key></Contents>" * (17 * 2**20 // 34) + \
                b"</ListBucketResult>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(404)
        self.end_headers()
        try:  # (40 MiB, as an endless body would go on: without the bound, read and parsed)
            for _ in range(40 * 2**20 // 57344):
                self.wfile.write(b"<Error>" * 8192)
        except OSError:
            return


def test_botocore_reads_a_whole_response_to_a_bound() -> None:
    """A response botocore reads whole (a LIST page, an error's body) is read to at
    most NON_STREAMING_MAX bytes and refused past it, not parsed: a page of a million
    keys held the event loop for a minute, a 404 with an endless body filled the memory."""
    import asyncio

    from aiobotocore.session import get_session
    from botocore.exceptions import HTTPClientError

    bound_non_streaming_responses()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HugeAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def main() -> None:
        async with get_session().create_client(
                "s3", endpoint_url=f"http://127.0.0.1:{server.server_address[1]}", region_name="us-east-1",
                aws_access_key_id="k", aws_secret_access_key="s") as client:
            # (botocore hands it on as a client error, after its own retries: each one bounded)
            with pytest.raises(HTTPClientError, match=f"more than {NON_STREAMING_MAX} bytes"):
                await client.list_objects_v2(Bucket="b")
            with pytest.raises(HTTPClientError, match=f"more than {NON_STREAMING_MAX} bytes"):
                await client.get_bucket_acl(Bucket="b")

    try:
        asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()


# -- http ----------------------------------------------------------------------------


class _Hostile(http.server.SimpleHTTPRequestHandler):
    """Files of a directory, but `a/c/0/0` is an endless body and `a/c/0/1` is gzipped
    whatever the client asked; and what the test sets on the server: `redirects`
    {path: Location}, `wrong_ranges` (every range answered with the object's first bytes),
    `cut_short` (paths whose body ends before its Content-Length), `forbidden` (403),
    `failing` (500)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        moved = getattr(self.server, "redirects", {}).get(self.path)
        if moved is not None:  # (a redirect the test set up: elsewhere, or within this server)
            self.send_response(302)
            self.send_header("Location", moved)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path in getattr(self.server, "cut_short", ()):  # a body shorter than it says
            data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data) + 100))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return
        if self.path in getattr(self.server, "forbidden", ()):
            self.send_error(403)
            return
        if self.path in getattr(self.server, "failing", ()):
            self.send_error(500)
            return
        wrong = getattr(self.server, "wrong_ranges", False) and self.headers.get("Range")
        if wrong and re.fullmatch(r"bytes=\d+-\d+", wrong):  # a 206 of the object's first bytes, whatever range was asked
            data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
            first, last = (int(v) for v in wrong.removeprefix("bytes=").split("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes 0-{last - first}/{len(data)}")
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            self.wfile.write(data[: last - first + 1])
            return
        if self.path.rstrip("/").endswith("/endless"):  # a directory page that never ends
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b'<a href="x">x</a>\n' * 4096)
            except OSError:
                return
        if self.path.endswith("/a/c/0/0"):
            self.send_response(200)
            self.end_headers()  # no Content-Length: the body ends when the connection does
            try:
                while True:
                    self.wfile.write(bytes(1 << 16))
            except OSError:
                return
        if self.path.endswith("/a/c/1/1"):  # an honest chunk, stored gzip-encoded (sent so whatever is asked)
            with open(Path(self.directory) / self.path.lstrip("/"), "rb") as f:
                return self._gzipped(f.read())
        if self.path.endswith("/a/c/0/1"):
            return self._gzipped(bytes(64 * 2**20))
        super().do_GET()

    def _gzipped(self, data: bytes) -> None:
        body = gzip.compress(data, 1)
        self.send_response(200)
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hostile_server(tmp_path: Path) -> Iterator[tuple[Path, str, http.server.ThreadingHTTPServer]]:
    """A `_Hostile` server of `tmp_path/www`: (root, URL, the server: set `redirects`
    {path: Location} or `wrong_ranges` on it)."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **kw: _Hostile(*a, directory=str(root), **kw))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hostile_http(hostile_server: tuple[Path, str, http.server.ThreadingHTTPServer]) -> tuple[Path, str]:
    return hostile_server[0], hostile_server[1]


def test_http_bodies_are_bounded_and_never_decompressed(hostile_http: tuple[Path, str]) -> None:
    """[hostile-12] an http(s) chunk whose body never ends is read to its bound and
    refused; one the server gzips anyway is decoded no further than that bound (an
    honest one reads); a group's members are listed from its directory page (`a/`)."""
    root, url = hostile_http
    _store(root / "s.zarr")
    view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
    view.list_dir(())  # (a remote group's members are opened when first looked at)
    array = dict(view.arrays())[("a",)]
    assert bytes(array.pixel_bytes((1, 0))) == np.arange(256, dtype="u1").reshape(16, 16)[8:, :8].tobytes()
    with pytest.raises(CorruptDataError, match=r"a/c/0/0: the server sent more than 1048704 bytes"):
        array.pixel_bytes((0, 0))
    with pytest.raises(CorruptDataError, match=r"a/c/0/1: the server sent more than 1048704 bytes"):
        array.pixel_bytes((0, 1))  # (a gzip body of 64 MiB of zeros: decoded no further than the bound)
    assert bytes(array.pixel_bytes((1, 1))) == np.arange(256, dtype="u1").reshape(16, 16)[8:, 8:].tobytes()
    assert json.loads(array.metadata_bytes)["shape"] == [16, 16]


def test_an_http_directory_page_is_read_to_a_bound(hostile_http: tuple[Path, str]) -> None:
    """[hostile-12] a group whose directory page never ends: its listing fails at 16 MiB
    read, naming the page (fsspec read it whole: the daemon reached 4 GB in 9 s); the
    rest of the store is shown as usual."""
    import resource

    root, url = hostile_http
    _store(root / "s.zarr")
    zarr.open_group(str(root / "s.zarr" / "endless"), mode="w")
    view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
    view.list_dir(())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CorruptDataError, match=r"s.zarr/endless/?: the server sent more than 16777216 bytes"):
        view.list_dir(("endless",))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # (KiB)
    assert dict(view.arrays())[("a",)].pixel_bytes((1, 0))


def test_a_remote_shard_is_rewritten_within_its_own_bound(tmp_path: Path, s3: S3Server, monkeypatch) -> None:
    """Writing an inner chunk of a remote shard reads the shard whole (zarr rewrites it):
    that read is bounded by what the shard can hold, not by the default bound of an
    object of unknown size (here made smaller than the shard: before, the write failed)."""
    from zfuse import defaults

    root = tmp_path / "s.zarr"
    zarr.open_group(str(root), mode="w")
    a = zarr.create_array(str(root / "a"), shape=(64, 64), chunks=(8, 8), shards=(64, 64), dtype="u1",
                          fill_value=0, compressors=None)
    a[...] = (np.arange(64 * 64) % 251).astype("u1").reshape(64, 64)
    upload(s3, root, "shards", "s.zarr")
    monkeypatch.setattr(defaults, "REMOTE_OBJECT_MAX", 3000)  # (the shard is about 5 KB)
    view = make_view(MountConfig(["s3://shards/s.zarr"], "/nonexistent", read_only=False,
                                 storage_options=s3.storage_options))
    view.list_dir(())
    array = dict(view.arrays())[("a",)]
    array.source.write_chunk((0, 0), np.full((8, 8), 7, "u1"))
    assert bytes(array.pixel_bytes((0, 0))) == bytes([7]) * 64


def test_a_remote_shard_index_claiming_a_huge_inner_chunk_asks_for_nothing(tmp_path: Path, s3: S3Server) -> None:
    """[hostile-12] a shard index (checksum valid) giving an inner chunk 2**40 bytes: the
    read is refused from the index, past what the inner chunk can be stored in, and no
    such range is asked for (a server streaming it would have been read on)."""
    import struct

    import crc32c

    root = tmp_path / "s.zarr"
    zarr.open_group(str(root), mode="w")
    a = zarr.create_array(str(root / "a"), shape=(16, 16), chunks=(8, 8), shards=(16, 16), dtype="u1",
                          fill_value=0, compressors=None)
    a[...] = 1
    shard = bytearray((root / "a" / "c" / "0" / "0").read_bytes())
    index = bytearray(shard[-(16 * 4 + 4):-4])
    struct.pack_into("<QQ", index, 0, 0, 2**40)
    shard[-(16 * 4 + 4):] = bytes(index) + struct.pack("<I", crc32c.crc32c(bytes(index)))
    (root / "a" / "c" / "0" / "0").write_bytes(bytes(shard))
    upload(s3, root, "bigentry", "s.zarr")
    view = make_view(MountConfig(["s3://bigentry/s.zarr"], "/nonexistent", read_only=True,
                                 storage_options=s3.storage_options))
    view.list_dir(())
    array = dict(view.arrays())[("a",)]
    before = len(s3.requests())
    with pytest.raises(CorruptDataError, match="inner chunk .* is 1099511627776 bytes in the shard's index"):
        array.pixel_bytes((0, 0))
    assert not [r for r in s3.requests()[before:] if "bytes=0-1099511627775" in str(r)]
    assert bytes(array.pixel_bytes((1, 1))) == bytes([1]) * 64


def test_http_redirects_stay_within_the_store_server(hostile_server) -> None:
    """[hostile-12] an http(s) object redirected to another server (another port, a
    file:// URL) is refused, EREMOTEIO naming both, and that server is never asked (a
    chunk file had shown the other server's bytes); a redirect within the store's own
    server is followed; the store is not taken for unreachable."""
    root, url, server = hostile_server
    _store(root / "s.zarr")
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    other.requests = []  # type: ignore[attr-defined]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        elsewhere = f"http://127.0.0.1:{other.server_address[1]}/secret/x"
        server.redirects = {"/s.zarr/a/c/0/0": elsewhere, "/s.zarr/a/c/0/1": "file:///etc/passwd",
                            "/s.zarr/a/c/1/0": "/s.zarr/a/c/1/1"}
        view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
        view.list_dir(())
        array = dict(view.arrays())[("a",)]
        for coords, target in (((0, 0), elsewhere), ((0, 1), "file:///etc/passwd")):
            with pytest.raises(OSError, match=f"redirected it to {re.escape(target)}: not followed") as e:
                array.pixel_bytes(coords)
            assert e.value.errno == errno.EREMOTEIO
        for location, said in (("http://127.0.0.1:99999/x", "redirected it to"), ("http://[::1/x", "redirected it to"),
                               ("", "with no Location")):
            server.redirects["/s.zarr/a/c/0/0"] = location  # (a port no URL can have; none at all)
            with pytest.raises(OSError, match=said) as e:
                array.pixel_bytes((0, 0))
            assert e.value.errno == errno.EREMOTEIO
        values = np.arange(256, dtype="u1").reshape(16, 16)
        assert bytes(array.pixel_bytes((1, 0))) == values[8:, 8:].tobytes()  # (moved within: followed)
        assert bytes(array.pixel_bytes((1, 1))) == values[8:, 8:].tobytes()  # (not taken for unreachable)
        assert other.requests == []  # type: ignore[attr-defined]
    finally:
        other.shutdown()
        other.server_close()


def test_what_is_one_server_and_what_a_message_shows_of_a_url() -> None:
    """A redirect stays on the store's server: the same scheme, host and port, or the
    default http port's https upgrade (not 8080's: another service); a URL as messages
    show it holds no credentials, in its user part or its query."""
    from zfuse.errors import source_label
    from zfuse.remote_objects import _same_server

    assert _same_server("http://h/a", "http://h:80/b") and _same_server("http://h/a", "https://h/b")
    assert not _same_server("http://h:8080/a", "https://h/b") and not _same_server("http://h/a", "http://g/b")
    assert not _same_server("http://h/a", "http://h:99999/b") and not _same_server("https://h/a", "http://h/b")
    assert source_label("https://u:pw@h:99999/a.zarr?X-Amz-Signature=abc") == "https://h:99999/a.zarr"
    assert source_label("http://[::1/x") == "http://[::1/x" and source_label("/local/a.zarr") == "/local/a.zarr"


class _Recording(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "64")
        self.end_headers()
        self.wfile.write(bytes(range(64)))


def test_a_range_answered_with_other_bytes_is_never_used(hostile_server) -> None:
    """[hostile-12] a 206 whose Content-Range is not the range asked (a server answering
    every range with the object's first bytes) is refused, EIO naming both ranges: it had
    been taken for the range's bytes (wrong pixels, silently, and cached so)."""
    from zarr.abc.store import RangeByteRequest

    from zfuse.remote_objects import check_content_range, check_length

    root, url, server = hostile_server
    stores_sharded = zarr.create_array(str(root / "s.zarr"), shape=(16, 16), shards=(16, 16), chunks=(8, 8),
                                       dtype="u1", fill_value=0)
    stores_sharded[...] = np.arange(256, dtype="u1").reshape(16, 16)
    server.wrong_ranges = True
    view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    refused = 0
    for coords in ((0, 0), (0, 1), (1, 0), (1, 1)):
        try:
            got = bytes(array.pixel_bytes(coords))
        except CorruptDataError as e:
            assert "the server answered bytes 0-" in str(e) and ": not used" in str(e), e
            refused += 1
        else:
            expect = np.arange(256, dtype="u1").reshape(16, 16)[8 * coords[0]:8 * coords[0] + 8,
                                                                8 * coords[1]:8 * coords[1] + 8]
            assert got == expect.tobytes(), coords
    assert refused >= 3
    assert check_content_range("u", RangeByteRequest(100, 200), "bytes 100-149/150") == 50  # (clipped at the end)
    for answered in ("bytes 0-99/150", "bytes 100-199/150", "bytes 100-150/*", None, "pages 1-2/3"):
        with pytest.raises(CorruptDataError, match="not used"):
            check_content_range("u", RangeByteRequest(100, 200), answered)
    with pytest.raises(CorruptDataError, match="said 50 bytes and held 60"):
        check_length("u", bytes(60), 50)


def test_an_answer_cut_short_or_refused_says_so(hostile_server) -> None:
    """[read-12] an http(s) body that ends before its Content-Length is the server's
    failure (EREMOTEIO, naming the request), not an unexpected error logged with its
    traceback; a 403 is EACCES, as S3's."""
    root, url, server = hostile_server
    _store(root / "s.zarr")
    server.cut_short = {"/s.zarr/a/c/1/0"}
    server.forbidden = {"/s.zarr/a/c/1/1"}
    view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
    view.list_dir(())
    array = dict(view.arrays())[("a",)]
    with pytest.raises(StoreServerError, match=r"store request get a/c/1/0 failed") as e:
        array.pixel_bytes((1, 0))
    assert e.value.errno == errno.EREMOTEIO
    with pytest.raises(OSError, match=r"get a/c/1/1 refused: the server answered 403") as e:
        array.pixel_bytes((1, 1))
    assert e.value.errno == errno.EACCES


def test_a_lookup_the_server_fails_is_no_missing_file(hostile_server) -> None:
    """[read-12] the existence of an http(s) chunk (a lookup before any listing) that the
    server answers 500 for is the server's failure (EREMOTEIO), not "no such file"
    (fsspec's exists answered False for any failure); a missing one is still none."""
    root, url, server = hostile_server
    _store(root / "s.zarr")
    (root / "s.zarr" / "a" / "c" / "1" / "0").unlink()
    server.failing = {"/s.zarr/a/c/0/0"}
    view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
    view.list_dir(())
    array = dict(view.arrays())[("a",)]
    with pytest.raises(StoreServerError, match="exists a/c/0/0") as e:
        array.source.chunk_exists((0, 0))
    assert e.value.errno == errno.EREMOTEIO
    # (one stored gzip-encoded: there all the same)
    assert array.source.chunk_exists((1, 1)) and not array.source.chunk_exists((1, 0))


def test_a_lookup_the_server_fails_costs_that_member_only(hostile_server, tmp_path: Path) -> None:
    """[tree-5] the server failing one lookup of a group's member (an implicit group's
    `.zarray`) makes that member a problem, shown so; the group is listed (its whole
    listing had failed with the lookup). With `-o cache=` a failed chunk lookup is the
    server's failure too, not "no such file"."""
    root, url, server = hostile_server
    _store(root / "s.zarr")
    zarr.create_array(str(root / "s.zarr" / "A" / "b"), shape=(4,), chunks=(4,), dtype="u1", fill_value=0)
    server.failing = {"/s.zarr/A/.zarray", "/s.zarr/a/c/0/0"}
    view = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True))
    assert {name for name, _ in view.list_dir(())} >= {"a", "A"}
    assert [p.path for p in view.problems] == ["A"]
    cached = make_view(MountConfig([f"{url}/s.zarr"], "/nonexistent", read_only=True,
                                   storage_options={"zfuse_cache": str(tmp_path / "cache")}))
    cached.list_dir(())
    with pytest.raises(StoreServerError, match="a/c/0/0"):
        dict(cached.arrays())[("a",)].source.chunk_exists((0, 0))


def test_an_encoded_body_is_decoded_in_time_linear_in_it() -> None:
    """[hostile-12] a gzip body of many empty members (8 MiB of them held the event loop
    for 6 minutes: the rest of the body was copied at every member) is refused past
    INFLATE_MEMBERS_MAX members, at once; a body of fewer decodes in one pass."""
    from zfuse.remote_objects import INFLATE_MEMBERS_MAX, _inflate

    empty = gzip.compress(b"")
    with pytest.raises(CorruptDataError, match=f"more than {INFLATE_MEMBERS_MAX} parts"):
        _inflate(empty * (8 * 2**20 // len(empty)), "gzip", 16 * 2**20, "u")
    many = b"".join(gzip.compress(bytes([i % 256]) * 100) for i in range(INFLATE_MEMBERS_MAX))
    assert _inflate(many, "gzip", 2**20, "u") == b"".join(bytes([i % 256]) * 100 for i in range(INFLATE_MEMBERS_MAX))


def test_an_encoded_body_is_decoded_whole_and_checked() -> None:
    """[hostile-12] a gzip body: every member, each to its end (a cut-off one, whose
    checksum never came, is refused), within the bound; a deflate body zlib-wrapped or
    raw, as servers send it."""
    import zlib

    from zfuse.remote_objects import _inflate

    two = gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 10)
    assert _inflate(two, "gzip", 2000, "u") == b"a" * 1000 + b"b" * 10
    with pytest.raises(CorruptDataError, match="does not decode"):
        _inflate(gzip.compress(b"a" * 1000)[:-6], "gzip", 2000, "u")
    with pytest.raises(CorruptDataError, match="more than 1000 bytes"):
        _inflate(gzip.compress(bytes(10**6)), "gzip", 1000, "u")
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert _inflate(raw.compress(b"xyz" * 100) + raw.flush(), "deflate", 1000, "u") == b"xyz" * 100
    assert _inflate(zlib.compress(b"q" * 50), "deflate", 1000, "u") == b"q" * 50
    with pytest.raises(CorruptDataError, match="br-encoded"):
        _inflate(b"x", "br", 1000, "u")


def test_versions_are_compared_as_one_spelling_and_never_a_size_alone() -> None:
    """[hostile-12] an ETag quoted in a GET's answer and not in a listing (or weak) is the
    same version (compared as written, every sharded chunk of such a server failed as
    changed, for ever); an object whose listing gives no ETag, generation or
    Last-Modified has no version (its size alone served the cached old bytes of every
    rewrite of the same size, for ever), and so is never served from the disk cache."""
    from zfuse.remote_objects import _version_of, etag

    assert etag("abc") == etag('"abc"') == etag(' W/"abc" ') == '"abc"'
    assert _version_of({"ETag": "abc"}) == _version_of({"ETag": '"abc"'})
    assert _version_of({"size": 64}) is None
    assert _version_of({"size": 64, "Last-Modified": "Thu, 26 Nov 2026 22:00:00 GMT"}) != \
        _version_of({"size": 64, "Last-Modified": "Thu, 26 Nov 2026 22:00:01 GMT"})
    assert _version_of({"generation": "17"}) == "17"


def test_an_s3_listing_repeating_its_pages_is_refused(tmp_path: Path, s3: S3Server) -> None:
    """[hostile-12] an S3 server sending the same continuation token again (a listing
    that never ends): refused at the repeat, one page read past it (s3fs asked for pages
    until the timeout, 330 MB a listing); a directory's listing and the flat listing of
    a prefix are read page by page."""
    from zarr.core.sync import sync

    from zfuse.store import MeteredStore, open_store

    from s3server import ConditionsIgnoredProxy

    class RepeatingPages(ConditionsIgnoredProxy):
        DROPPED = frozenset()
        pages = 0

        def forward(self, handler: object) -> None:
            path = getattr(handler, "path", "")
            if getattr(handler, "command", "") == "GET" and "list-type=2" in path and "prefix=s.zarr%2Fa%2Fc" in path:
                RepeatingPages.pages += 1
                body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>pages</Name>'
                        b"<Prefix>s.zarr/a/c/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>"
                        b"<Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>"
                        b"<Contents><Key>s.zarr/a/c/x</Key><ETag>&quot;e&quot;</ETag><Size>1</Size></Contents>"
                        b"<NextContinuationToken>same</NextContinuationToken></ListBucketResult>")
                handler.send_response(200)  # type: ignore[attr-defined]
                handler.send_header("Content-Length", str(len(body)))  # type: ignore[attr-defined]
                handler.end_headers()  # type: ignore[attr-defined]
                handler.wfile.write(body)  # type: ignore[attr-defined]
                return
            super().forward(handler)

    upload(s3, _store(tmp_path / "s.zarr"), "pages", "s.zarr")
    proxy = RepeatingPages(s3)
    options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url}
    store = MeteredStore(open_store("s3://pages/s.zarr", read_only=True, storage_options=options), None, 10.0,
                         "s3://pages/s.zarr")

    async def listed() -> list[str]:
        return [name async for name in store.list_dir("a/c")]

    async def walked() -> list[str]:
        return [name async for name in store.list_prefix("a/c/")]

    try:
        with pytest.raises(CorruptDataError, match="the server sent continuation token .same. a second time"):
            sync(listed())
        assert RepeatingPages.pages <= 3
        with pytest.raises(CorruptDataError, match="the server sent continuation token .same. a second time"):
            sync(walked())  # (the flat listing a walker makes: page by page too)
        assert RepeatingPages.pages <= 6
    finally:
        proxy.close()


def test_an_answer_without_an_s3_error_names_its_status_and_key(tmp_path: Path, s3: S3Server) -> None:
    """[read-12] a 403 whose body holds no S3 error (a proxy's page): the error names the
    status, the request and the key (botocore's said "An error occurred ()"), and is
    EACCES."""
    arr, proxy, _ = _failing_view(tmp_path, s3, "noerror", 403, "")
    try:
        with pytest.raises(OSError) as failed:
            arr.pixel_bytes((1, 1))
        assert failed.value.errno == errno.EACCES
        assert "store request get a/c/1/1 failed: the server answered 403 with no S3 error in its body " \
               "(s3://noerror/s.zarr)" in str(failed.value)
    finally:
        proxy.close()
