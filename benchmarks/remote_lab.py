"""A remote S3 server on this machine for benchmarks/s3_remote.py: network namespaces, a
queue delay, moto behind nginx, and nginx's access log as the count of requests.

    root namespace (the mounts, zarr-python) --veth-- "router" --veth-- "server"
                                                     (NFQUEUE delay)   (nginx -> moto)

- The "server" namespace runs moto's server mode on its loopback and nginx in front of it:
  moto closes every connection, real S3 keeps them open, so clients talk to nginx, whose
  upstream keeps connections to moto (`keepalive`). nginx's access log has one line per
  request with its start/end time, method, URI, status, bytes and Range header.
- The "router" namespace forwards between the two; with a delay, its iptables sends every
  forwarded packet to an NFQUEUE and `nfq_delay` (nfq_delay.c, compiled here with
  libnetfilter_queue) holds each for D ms before accepting it: D each way, 2*D RTT. The
  kernel has no netem. Latency 0 is the same path without the queue rule.

Everything made here (namespaces, veths, route, processes) is removed by `Lab.close()`,
which runs in `with Lab(...)`'s exit however the body ended. Needs root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PORT = 8080
MOTO_PORT = 5000
QUEUE_NUM = 7


@dataclass(frozen=True)
class Request:
    """One line of nginx's access log."""

    start: float  # epoch seconds ($msec - $request_time)
    end: float
    method: str
    uri: str
    status: int
    nbytes: int  # body bytes sent
    range: str  # the Range header, "" if none

    @property
    def kind(self) -> str:
        """GET (of an object), LIST (a GET of the bucket: listings, its location), HEAD, PUT, ..."""
        path = self.uri.partition("?")[0]
        if self.method == "GET" and "/" not in path.strip("/"):
            return "LIST"
        return self.method


# $msec is when the log line is written (the response sent); $request_time since the
# request's first byte was read: the request's span on the server
LOG_FORMAT = ('$msec $request_time $request_method "$request_uri" $status $body_bytes_sent '
              '"$http_range" $connection $connection_requests')
_LINE = re.compile(r'^(?P<end>[\d.]+) (?P<dur>[\d.]+) (?P<method>\S+) "(?P<uri>[^"]*)" (?P<status>\d+) '
                   r'(?P<nbytes>\d+) "(?P<range>[^"]*)"')


def parse_log(text: str) -> list[Request]:
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            end = float(m["end"])
            out.append(Request(end - float(m["dur"]), end, m["method"], m["uri"], int(m["status"]),
                               int(m["nbytes"]), "" if m["range"] == "-" else m["range"]))
    return out


def max_in_flight(reqs: Sequence[Request]) -> int:
    """The most requests the server was working on at one moment."""
    events = sorted([(r.start, 1) for r in reqs] + [(r.end, -1) for r in reqs])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _iptables() -> str:
    """iptables-legacy where there is one: iptables-nft turns NFQUEUE into nftables' `queue`,
    which kernels without CONFIG_NFT_QUEUE lack."""
    return shutil.which("iptables-legacy") or "iptables"


def build_delay(workdir: Path) -> Path:
    """Compile nfq_delay.c into workdir."""
    out = workdir / "nfq_delay"
    _run("cc", "-O2", "-o", str(out), str(HERE / "nfq_delay.c"), "-lnetfilter_queue", "-lnfnetlink")
    return out


class Lab:
    """The namespaces, the delay and the S3 server behind nginx (see the module docstring)."""

    def __init__(self, workdir: Path, key: str, secret: str, log=print) -> None:
        self.workdir = workdir
        self.key, self.secret = key, secret
        self.log = log
        tag = f"{os.getpid() % 100000}"
        self.router_ns, self.server_ns = f"zfb-router-{tag}", f"zfb-server-{tag}"
        self.host_if, self.router_in = f"zb{tag}h", f"zb{tag}r"
        self.router_out, self.server_if = f"zb{tag}s", f"zb{tag}v"
        # 10.213.x: nothing else here uses it (checked in setup: no route may cover it)
        self.host_ip, self.router_ip_in = "10.213.1.1", "10.213.1.2"
        self.router_ip_out, self.server_ip = "10.213.2.1", "10.213.2.2"
        self.procs: list[subprocess.Popen] = []
        self.delay_proc: subprocess.Popen | None = None
        self.delay_ms = 0.0
        self.made_links = self.made_ns = False
        self.access_log = workdir / "access.log"
        self.delay_bin: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.server_ip}:{PORT}"

    def __enter__(self) -> Lab:
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- network ------------------------------------------------------------------
    def _ns(self, ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", ns, *cmd, check=check)

    def setup(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("needs root (network namespaces, iptables)")
        routes = _run("ip", "route", "show", "to", "match", self.server_ip).stdout
        if "10.213." in routes:
            raise RuntimeError(f"10.213.0.0/16 is in use here already: {routes.strip()}")
        self.delay_bin = build_delay(self.workdir)
        self.made_ns = True
        _run("ip", "netns", "add", self.router_ns)
        _run("ip", "netns", "add", self.server_ns)
        self.made_links = True
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.router_in)
        _run("ip", "link", "set", self.router_in, "netns", self.router_ns)
        self._ns(self.router_ns, "ip", "link", "add", self.router_out, "type", "veth", "peer", "name",
                 self.server_if)
        self._ns(self.router_ns, "ip", "link", "set", self.server_if, "netns", self.server_ns)
        _run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        self._ns(self.router_ns, "ip", "addr", "add", f"{self.router_ip_in}/24", "dev", self.router_in)
        self._ns(self.router_ns, "ip", "addr", "add", f"{self.router_ip_out}/24", "dev", self.router_out)
        for dev in ("lo", self.router_in, self.router_out):
            self._ns(self.router_ns, "ip", "link", "set", dev, "up")
        self._ns(self.router_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._ns(self.server_ns, "ip", "addr", "add", f"{self.server_ip}/24", "dev", self.server_if)
        for dev in ("lo", self.server_if):
            self._ns(self.server_ns, "ip", "link", "set", dev, "up")
        self._ns(self.server_ns, "ip", "route", "add", "default", "via", self.router_ip_out)
        _run("ip", "route", "add", "10.213.2.0/24", "via", self.router_ip_in)
        self._start_servers()

    def _start_servers(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.key, AWS_SECRET_ACCESS_KEY=self.secret,
                   AWS_DEFAULT_REGION="us-east-1")
        with open(self.workdir / "moto.log", "ab") as out:
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", self.server_ns, sys.executable, "-m", "moto.server", "-H",
                 "127.0.0.1", "-p", str(MOTO_PORT)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
        conf = self.workdir / "nginx.conf"
        tmp = self.workdir / "nginx-tmp"
        tmp.mkdir(exist_ok=True)
        conf.write_text(f"""
worker_processes 1;
daemon off;
user root;
pid {self.workdir}/nginx.pid;
error_log {self.workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format s3 '{LOG_FORMAT}';
    access_log {self.access_log} s3;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 0;
    keepalive_timeout 600s;
    keepalive_requests 1000000;
    upstream moto {{ server 127.0.0.1:{MOTO_PORT}; keepalive 64; }}
    server {{
        listen {self.server_ip}:{PORT} backlog=4096;
        location / {{
            proxy_pass http://moto;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
""")
        with open(self.workdir / "nginx.out", "ab") as out:
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", self.server_ns, "nginx", "-c", str(conf), "-p", str(self.workdir)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[4:6]} exited ({p.returncode}); see {self.workdir}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    break
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto behind nginx not up after 60 s; see {self.workdir}")
            time.sleep(0.1)

    # -- delay ------------------------------------------------------------------------
    def set_delay(self, one_way_ms: float) -> None:
        """Hold every forwarded packet one_way_ms (0: no queue at all)."""
        if self.delay_proc is not None:
            self._ns(self.router_ns, _iptables(), "-D", "FORWARD", "-j", "NFQUEUE", "--queue-num",
                     str(QUEUE_NUM), check=False)
            self._stop(self.delay_proc)
            self.delay_proc = None
        self.delay_ms = one_way_ms
        if one_way_ms <= 0:
            return
        assert self.delay_bin is not None
        self.delay_proc = subprocess.Popen(
            ["ip", "netns", "exec", self.router_ns, str(self.delay_bin), str(QUEUE_NUM), str(one_way_ms)],
            stdout=subprocess.PIPE, stderr=open(self.workdir / "nfq_delay.err", "ab"), stdin=subprocess.DEVNULL)
        line = self.delay_proc.stdout.readline() if self.delay_proc.stdout else b""
        if line.strip() != b"ready":
            raise RuntimeError(f"nfq_delay did not start: {(self.workdir / 'nfq_delay.err').read_text()}")
        self._ns(self.router_ns, _iptables(), "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM))

    def ping_rtt_ms(self, count: int = 10) -> tuple[float, float, float]:
        """min/avg/max ping RTT to the server through the router."""
        out = _run("ping", "-n", "-q", "-c", str(count), "-i", "0.05", self.server_ip).stdout
        m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/", out)
        if not m:
            raise RuntimeError(f"ping gave no RTT: {out}")
        return float(m[1]), float(m[2]), float(m[3])

    # -- requests -------------------------------------------------------------------
    def log_offset(self) -> int:
        try:
            return self.access_log.stat().st_size
        except FileNotFoundError:
            return 0

    def requests_since(self, offset: int) -> list[Request]:
        with open(self.access_log, "rb") as f:
            f.seek(offset)
            return parse_log(f.read().decode(errors="replace"))

    # -- teardown -------------------------------------------------------------------
    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def close(self) -> None:
        if self.delay_proc is not None:
            self._stop(self.delay_proc)
            self.delay_proc = None
        for p in reversed(self.procs):
            self._stop(p)
        self.procs.clear()
        if self.made_ns:
            # whatever still runs inside our namespaces was started by this lab
            for ns in (self.router_ns, self.server_ns):
                pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except (ProcessLookupError, ValueError):
                        pass
        if self.made_links:
            _run("ip", "route", "del", "10.213.2.0/24", check=False)
            _run("ip", "link", "del", self.host_if, check=False)
        if self.made_ns:
            _run("ip", "netns", "del", self.router_ns, check=False)
            _run("ip", "netns", "del", self.server_ns, check=False)
            self.made_ns = self.made_links = False
