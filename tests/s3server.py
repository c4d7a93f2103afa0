"""A real S3-compatible server for tests: moto's server mode in a child process.

A separate process (not a thread) so a test can hang it (SIGSTOP), kill it and
start it again on the same port while a mount is using it. Loopback only.
Every request the server answers is logged by werkzeug to `log_path`; the
parsed log (`requests()`) is the server's own count of GETs, independent of
zfuse's `.zfuse/stats` counters.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"  # never another address: the tests' server is loopback only
KEY = SECRET = "test"
# `127.0.0.1 - - [date] "GET /bucket/key?x=y HTTP/1.1" 206 -`; werkzeug colours some lines
_LOG_RE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
_ANSI_RE = re.compile(r"\x1b\[[\d;]*m")


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # URL path without the query string, e.g. /bucket/a.zarr/c/0/0
    query: str
    status: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class S3Server:
    """`python -m moto.server` on 127.0.0.1:port; start/stop/pause/resume at will."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.client: Any = None  # boto3 client, made once by make_bucket (clients are slow to make)

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """For zarr/fsspec in the test process (the mount gets credentials from env)."""
        return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": self.endpoint_url,
                                                                "region_name": "us-east-1"}}

    def env(self) -> dict[str, str]:
        """Environment for a zfuse process: credentials the usual way, no real AWS config."""
        env = dict(os.environ)
        env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1",
                   AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")
        env.pop("AWS_PROFILE", None)
        return env

    def start(self, timeout: float = 30) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server not up after {timeout}s:\n{self.log()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill the server (works on a paused one too); its state is lost."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Same port again (HTTPServer sets SO_REUSEADDR); moto starts empty."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """A hung server: the socket still accepts connections, nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def requests(self) -> list[Request]:
        out = []
        for m in _LOG_RE.finditer(_ANSI_RE.sub("", self.log())):
            path, _, query = m["path"].partition("?")
            out.append(Request(m["method"], path, query, int(m["status"])))
        return out

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_bucket(server: S3Server, name: str) -> Any:
    """Create `name` (if missing) with boto3; returns the server's client."""
    import boto3

    client = server.client
    if client is None:
        client = server.client = boto3.client(
            "s3", endpoint_url=server.endpoint_url, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
            region_name="us-east-1")
    try:
        client.create_bucket(Bucket=name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return client


class ConditionsIgnoredProxy:
    """A real HTTP proxy in front of an S3Server that drops the If-Match and
    If-None-Match headers of every request: an S3-compatible store that accepts
    conditional writes without checking them (some do). Threads of the test process,
    loopback only. (moto does not check signatures, so the dropped signed headers
    pass.)"""

    DROPPED = frozenset({"if-match", "if-none-match"})

    def __init__(self, server: S3Server) -> None:
        import http.server
        import threading

        self.server = server
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # (quiet)
                pass

            def forward(self) -> None:
                proxy.forward(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        self.httpd = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.httpd.server_address[1]}"

    def forward(self, handler: Any) -> None:
        import http.client

        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in self.DROPPED}
        conn = http.client.HTTPConnection(HOST, self.server.port, timeout=30)
        try:
            conn.request(handler.command, handler.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        handler.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                handler.send_header(name, value)
        length_header = response.getheader("Content-Length")
        handler.send_header("Content-Length", length_header if handler.command == "HEAD" and length_header
                            else str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RangeIgnoredProxy(ConditionsIgnoredProxy):
    """The same proxy, dropping every request's Range header instead: a GET of a byte
    range is answered with the whole object (200, no Content-Range), as behind a proxy
    or a server that does not do ranges."""

    DROPPED = frozenset({"range"})


class FailingProxy(ConditionsIgnoredProxy):
    """The same proxy, answering every GET of an object whose key ends in `suffix` with
    `status` and an S3 error document of `code` (a server failing one object: 500
    InternalError, 503 SlowDown; with `location`, a redirect there), and counting those
    GETs (`failed`). `gone()`: no
    request answered any more, nor any connection accepted (the endpoint gone)."""

    gone_now = False

    DROPPED = frozenset()

    def __init__(self, server: S3Server, suffix: str, status: int, code: str, location: str | None = None) -> None:
        self.suffix, self.status, self.code, self.location = suffix, status, code, location
        self.failed = 0
        super().__init__(server)

    def gone(self) -> None:
        self.gone_now = True
        self.close()

    def silent(self) -> None:
        """The endpoint drops connections silently (a firewall, a network gone): its
        port stays open, but no new connection completes (a listening socket with a
        backlog of 0, held full) and connections kept alive are closed unanswered."""
        port = self.httpd.server_address[1]
        self.gone()
        self.black_hole = socket.socket()
        self.black_hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.black_hole.bind((HOST, port))
        self.black_hole.listen(0)
        self.filler = socket.create_connection((HOST, port), timeout=5)  # (the backlog, now full)

    def forward(self, handler: Any) -> None:
        if self.gone_now:  # (a connection kept alive from before: closed unanswered)
            handler.close_connection = True
            return
        if handler.command == "GET" and handler.path.split("?")[0].endswith(self.suffix):
            self.failed += 1
            body = f"<Error><Code>{self.code}</Code><Message>failing on purpose</Message></Error>".encode()
            handler.send_response(self.status)
            if self.location is not None:  # (a redirect)
                handler.send_header("Location", self.location)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        super().forward(handler)
