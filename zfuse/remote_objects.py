"""Remote objects with their versions, and writes on condition of them.

The disk cache (`-o cache=DIR`) and conditional writes need each object's version
(its ETag), which zarr's FsspecStore never returns. `RemoteObjects` asks for it with
the same requests FsspecStore makes (one GET per read, one LIST per listing, one PUT
per write), reading the ETag off each response; on S3 through s3fs's own client: GETs
pinned to a version (If-Match) whose body may be handed on part by part, PUTs on
condition of one (If-Match, If-None-Match: `WriteConflictError`), and the probe that
finds once per bucket whether the store honours such conditions (`start_conditions_probe`).
`zfuse.store.MeteredStore` counts, bounds and caches these requests; nothing here
knows of it, of the mount or of FUSE.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import re
import string
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    SuffixByteRequest,
)

from zfuse import defaults
from zfuse.errors import CorruptDataError, causes, source_label

log = logging.getLogger("zfuse.store")  # the name its lines always had

S3_PROTOCOLS = ("s3", "s3a")
ABSENT = ""  # the version of no object: a write on condition that there is none (If-None-Match: *)
SINGLE_PUT_MAX = 5 * 2**30  # S3's largest PutObject; bigger objects go through s3fs (multipart)


class ServerAnswers:
    """The failed tries of one request: botocore retries a 5xx, a throttle (429) or a
    lost connection inside the request, so without this a server answering 503 for
    ever reads as a timeout, and a 500 as the server's text alone."""

    __slots__ = ("failed", "answer", "exception")

    def __init__(self) -> None:
        self.failed = 0
        self.answer = ""  # the last failed try's answer ("503 SlowDown"), if it had one
        self.exception = ""  # else the error's type ("EndpointConnectionError")

    def __bool__(self) -> bool:
        return self.failed > 0

    def __str__(self) -> str:
        tries = "its only try" if self.failed == 1 else f"{self.failed} tries"
        if self.answer:
            return f"the server answered {self.answer} to {tries}"
        return f"no answer to {tries} ({self.exception})" if self.failed else ""


# the answers of the request under way (set around each request by MeteredStore; the
# request's task carries it into botocore's retry loop)
request_answers: ContextVar[ServerAnswers | None] = ContextVar("zfuse_request_answers", default=None)
RETRIED_STATUS_MIN = 500


def note_server_answer(response: Any = None, caught_exception: BaseException | None = None, **_: Any) -> None:
    """botocore's `needs-retry` event (each try of a request, before botocore decides
    whether to retry it): a failed try is noted in the request's ServerAnswers. Decides
    nothing (None: botocore's own handler decides)."""
    answers = request_answers.get()
    if answers is None:
        return
    if caught_exception is not None:
        answers.failed += 1
        answers.answer, answers.exception = "", type(caught_exception).__name__
    elif response is not None:
        http, parsed = response
        status = getattr(http, "status_code", 0) or 0
        if status >= RETRIED_STATUS_MIN or status == 429:
            code = ((parsed or {}).get("Error") or {}).get("Code") if isinstance(parsed, dict) else None
            answers.failed += 1
            answers.answer = f"{status} {code}" if code else str(status)


def etag(value: str | None) -> str | None:
    """An ETag in one spelling: quoted, strong (servers and proxies quote it, or not, in
    listings and in GET answers; compared as written, one object's ETag was two versions);
    None for none."""
    if not value:
        return None
    value = str(value).strip().removeprefix("W/")
    return '"' + value.strip('"') + '"'


def _version_of(info: dict[str, Any]) -> str | None:
    """An object's version from its listing or HEAD entry: the ETag where the store gives
    one (S3, HTTP), else GCS's generation or md5, else an http server's Last-Modified with
    the size; None where nothing would change with the object (its size alone stays the
    same over most rewrites of a chunk: a version that cannot tell them apart served
    the cached old bytes for ever)."""
    for name in ("ETag", "etag"):
        if info.get(name):
            return etag(info[name])
    for name in ("generation", "md5Hash"):
        value = info.get(name)
        if value:
            return str(value)
    modified, size = info.get("Last-Modified"), info.get("size")
    return f"modified:{modified}|size:{size}" if modified and size is not None else None


STREAM_PART = 256 << 10  # bytes of a response body read at a time when its parts are handed on


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def check_content_range(url: str, byte_range: ByteRequest, answered: str | None) -> int:
    """How many bytes a 206 answer to `byte_range` holds, when its Content-Range is the
    range asked (clipped at the object's end); CorruptDataError otherwise: another
    range's bytes had been taken for this one's (wrong pixels, and cached so)."""
    m = _CONTENT_RANGE.fullmatch(str(answered or "").strip())
    asked = _http_range(byte_range)
    refused = CorruptDataError(f"{url}: asked for {asked}, the server answered {answered or 'no Content-Range'}: "
                               "not used")
    if m is None:
        raise refused
    first, last = int(m[1]), int(m[2])
    total = None if m[3] == "*" else int(m[3])
    if last < first or (total is not None and last >= total):
        raise refused
    clipped = total is not None and last == total - 1
    if isinstance(byte_range, RangeByteRequest):
        ok = first == byte_range.start and (last == byte_range.end - 1 or (clipped and last < byte_range.end))
    elif isinstance(byte_range, OffsetByteRequest):
        ok = first == byte_range.offset and clipped
    elif isinstance(byte_range, SuffixByteRequest):
        ok = clipped and last - first + 1 == min(byte_range.suffix, total or 0)
    else:
        ok = False
    if not ok:
        raise refused
    return last - first + 1


def _answers_range(response: dict[str, Any], byte_range: ByteRequest | None) -> bool:
    """Whether a GET's response holds exactly the bytes of `byte_range` (a 206 whose
    Content-Range is that range, `check_content_range`, and whose length is its length),
    so its body's parts can be handed on as they come: a server that sends the whole
    object instead would have them taken for the range's bytes."""
    if not isinstance(byte_range, RangeByteRequest) or not response.get("ContentRange"):
        return False
    try:
        length = check_content_range("", byte_range, response["ContentRange"])
    except CorruptDataError:
        return False
    return length == byte_range.end - byte_range.start == response.get("ContentLength")


def check_length(url: str, data: bytes, expected: int) -> bytes:
    """`data` if it is the `expected` length a Content-Range said, else CorruptDataError."""
    if len(data) != expected:
        raise CorruptDataError(f"{url}: the server's answer said {expected} bytes and held {len(data)}: not used")
    return data


async def _range_of_whole_object(body: Any, byte_range: ByteRequest) -> bytes:
    """The bytes of `byte_range` taken from a body that holds the whole object (a server,
    or a proxy before it, that ignored the Range), read part by part and keeping only
    those bytes: memory is the range's length, never the object's."""
    suffix = byte_range.suffix if isinstance(byte_range, SuffixByteRequest) else None
    if isinstance(byte_range, RangeByteRequest):
        start, stop = byte_range.start, byte_range.end
    else:
        start, stop = (byte_range.offset if isinstance(byte_range, OffsetByteRequest) else 0), None
    out = bytearray()
    at = 0
    while (stop is None or at < stop) and (part := await body.read(STREAM_PART)):
        if suffix is not None:
            out += part
            del out[:max(0, len(out) - suffix)]
        else:
            low, high = max(start - at, 0), len(part) if stop is None else min(len(part), stop - at)
            if low < high:
                out += part[low:high]
        at += len(part)
    return bytes(out)


def _range_length(byte_range: ByteRequest | None) -> int | None:
    """How many bytes `byte_range` holds, where that is known without the object's size."""
    if isinstance(byte_range, RangeByteRequest):
        return max(0, byte_range.end - byte_range.start)
    if isinstance(byte_range, SuffixByteRequest):
        return byte_range.suffix
    return None


#: bytes a response botocore reads whole (not a GetObject body: a LIST page, an error) may
#: have: a page of 1,000 keys of 1,024 bytes is under 2 MB
NON_STREAMING_MAX = 16 * 2**20


def too_large(key: str, limit: int) -> CorruptDataError:
    return CorruptDataError(f"{key}: the server sent more than {limit} bytes for it, more than zfuse "
                            "reads of such an object whole (what it can hold): not read further")


async def read_whole(body: Any, limit: int, key: str) -> bytes:
    """A whole response body of at most `limit` bytes; past that, the read stops and
    `too_large` is raised (an endless body, or a 1 GiB `zarr.json`, is not held)."""
    out = bytearray()
    while part := await body.read(STREAM_PART):
        out += part
        if len(out) > limit:
            raise too_large(key, limit)
    return bytes(out)


def bound_non_streaming_responses() -> None:
    """Make aiobotocore read a response it reads whole (LIST pages, error bodies, not
    GetObject's stream) to at most NON_STREAMING_MAX bytes: a LIST page of a million
    keys (194 MB) held the event loop for a minute while botocore parsed it, and a 404
    with an endless body filled the memory. Once per process."""
    from aiobotocore.awsrequest import AioAWSResponse

    if getattr(AioAWSResponse, "_zfuse_bounded", False):
        return

    async def _content_prop(self: Any) -> bytes:
        if self._content is None:
            length = self.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > NON_STREAMING_MAX:
                raise too_large(str(self.url), NON_STREAMING_MAX)
            content = getattr(self.raw, "content", None)  # (aiohttp's stream: read in parts)
            if content is None:
                self._content = await self.raw.read() or b""
            else:
                self._content = await read_whole(content, NON_STREAMING_MAX, str(self.url))
        return self._content

    given_init = AioAWSResponse.__init__

    def __init__(self: Any, url: str, status_code: int, headers: Any, raw: Any) -> None:
        refused = _redirect_refused(raw)
        if refused is not None:
            raise refused
        given_init(self, url, status_code, headers, raw)

    AioAWSResponse._content_prop = _content_prop  # type: ignore[method-assign]
    AioAWSResponse.__init__ = __init__  # type: ignore[method-assign]
    AioAWSResponse._zfuse_bounded = True  # type: ignore[attr-defined]


class _RequestsNotRedirected:
    """An aiohttp session whose requests follow no redirect (what aiobotocore's
    `send` asks of it), the rest of it as it is."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.request(*args, **{**kwargs, "allow_redirects": False})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def follow_no_s3_redirects() -> None:
    """Make aiobotocore's HTTP requests follow no redirect, as botocore's own never do
    (urllib3 with `Retry(False)`; AWS's SDKs agree): an S3 redirect is botocore's to
    handle (its region redirector re-signs for the bucket's region), while aiohttp
    following a `Location` sent the request to any host the endpoint named, whose
    answer `_redirect_refused` then threw away. Once per process; where aiobotocore
    has no such method (another version), its redirects stay refused by their answer."""
    from aiobotocore.httpsession import AIOHTTPSession

    given = getattr(AIOHTTPSession, "_get_session", None)
    if given is None or getattr(AIOHTTPSession, "_zfuse_no_redirects", False):
        return

    async def _get_session(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _RequestsNotRedirected(await given(self, *args, **kwargs))

    AIOHTTPSession._get_session = _get_session  # type: ignore[method-assign]
    AIOHTTPSession._zfuse_no_redirects = True  # type: ignore[attr-defined]


class RedirectRefusedError(OSError):
    """A request the server redirected off its own server (an S3 one: aiohttp follows
    redirects, botocore never does; an http(s) one: `_get_same_origin`), or in a loop:
    not followed as the object's answer. EREMOTEIO."""


def _redirect_refused(raw: Any) -> RedirectRefusedError | None:
    """The refusal of a response aiohttp reached by following a redirect to another host
    (a chunk file showed a host the endpoint named; the store's bytes are the endpoint's
    own), except AWS's own redirects between its regional endpoints; None otherwise."""
    history = getattr(raw, "history", None)
    if not history:
        return None
    first, last = getattr(history[0], "url", None), getattr(raw, "url", None)
    start, end = (f"{u.scheme}://{u.host}:{u.port}" if u is not None else None for u in (first, last))
    hosts = [str(getattr(u, "host", "")) for u in (first, last)]
    if start == end or all(h.endswith(".amazonaws.com") for h in hosts):
        return None
    return RedirectRefusedError(errno.EREMOTEIO, f"the server at {start} redirected the request to {end}: "
                                "not followed (the store's objects are its own)")


async def _read_at_most(body: Any, limit: int | None) -> bytes:
    """A response body, but no more than one part past `limit` bytes (a server sending
    more than the range it answers is cut short: its caller finds the length wrong)."""
    if limit is None:
        return bytes(await body.read())
    out = bytearray()
    while len(out) <= limit and (part := await body.read(STREAM_PART)):
        out += part
    return bytes(out)


_RANGES_IGNORED: set[str] = set()  # servers (scheme://host) found sending whole objects for ranges


def note_range_ignored(server: str, url: str) -> None:
    """A GET of a byte range of `url` brought the whole object: logged once per `server`."""
    if server not in _RANGES_IGNORED:
        _RANGES_IGNORED.add(server)
        log.warning("%s: the server sent the whole object for a byte range (does a proxy drop Range "
                    "headers, or does the server not do ranges?); each range is taken from whole "
                    "objects, which costs their transfer", source_label(url))


def _encoding(response: Any) -> str:
    return str(response.headers.get("Content-Encoding", "identity")).strip().lower() or "identity"


def _encoded_refusal(url: str, encoding: str) -> CorruptDataError:
    return CorruptDataError(f"{url}: the server sent a {encoding}-encoded body, though the body "
                            "as stored was asked for (Accept-Encoding: identity): not read")


def _refuse_encoded(response: Any, url: str) -> None:
    """zfuse asks http(s) servers for bodies as stored (Accept-Encoding: identity): a
    byte range of an encoded body is no range of the object."""
    encoding = _encoding(response)
    if encoding != "identity":
        raise _encoded_refusal(url, encoding)


#: gzip members an encoded http(s) body may have (each a decoder made anew)
INFLATE_MEMBERS_MAX = 4096


def _inflate(data: bytes, encoding: str, limit: int, url: str) -> bytes:
    """A gzip- or deflate-encoded body (sent whatever was asked: an object stored with
    that encoding behind some servers) decoded into at most `limit` bytes (a 6 MB body
    of zeros is gigabytes: `too_large` past the limit)."""
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise _encoded_refusal(url, encoding)
    # gzip (every member, each checked to its end), or deflate: zlib-wrapped as HTTP says,
    # or raw as many servers send it
    attempts = [31] if encoding != "deflate" else [15, -15]
    body = memoryview(data)
    for i, wbits in enumerate(attempts):
        out, at, members = bytearray(), 0, 0
        try:
            while at < len(body):
                members += 1
                if members > INFLATE_MEMBERS_MAX:
                    raise CorruptDataError(f"{url}: its {encoding}-encoded body has more than "
                                           f"{INFLATE_MEMBERS_MAX} parts (gzip members): not decoded")
                inflater = zlib.decompressobj(wbits)
                # fed a slice at a time: the rest of the body is never copied (it was, for
                # every member: 8 MiB of empty members held the event loop for minutes)
                while not inflater.eof and at < len(body):
                    piece = body[at : at + STREAM_PART]
                    out += inflater.decompress(piece, limit + 1 - len(out))
                    if len(out) > limit:
                        raise too_large(url, limit)
                    at += len(piece) - len(inflater.unused_data) - len(inflater.unconsumed_tail)
                if not inflater.eof:
                    raise zlib.error("the stream ends early")
                if wbits != 31:
                    break  # (one deflate stream; what follows it is not read, as before)
            return bytes(out)
        except zlib.error as e:
            if i == len(attempts) - 1:
                raise CorruptDataError(f"{url}: its {encoding}-encoded body does not decode: {e}") from e
    raise AssertionError("unreachable")  # pragma: no cover


async def get_http_object(fs: Any, url: str, limit: int) -> bytes | None:
    """The whole http(s) object at `url` through fsspec's HTTPFileSystem `fs`, at most
    `limit` bytes (`too_large` past that: fsspec reads a body whole, however long); None
    if there is none."""
    try:
        data, _ = await _http_body(fs, url, limit)
    except FileNotFoundError:
        return None
    return data


#: redirects an http(s) request follows at most, each within the store's own server
REDIRECTS_MAX = 5
DEFAULT_PORTS = {"http": 80, "https": 443}  # (a URL without a port names these)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _same_server(url: str, target: str) -> bool:
    """Whether `target` is on the server of `url`: the same scheme, host and port, or the
    same host's https (an upgrade). A URL that does not parse (a port of 99999) is none."""
    try:
        a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(target)
        here = (a.scheme.lower(), (a.hostname or "").lower(), a.port or DEFAULT_PORTS.get(a.scheme.lower()))
        there = (b.scheme.lower(), (b.hostname or "").lower(), b.port or DEFAULT_PORTS.get(b.scheme.lower()))
    except ValueError:
        return False
    return there == here or (here[0] == "http" and here[2] == 80 and there[0] == "https" and there[1] == here[1]
                             and there[2] == 443)  # (an upgrade of the default port only: 8080 may be another service)


async def _get_same_origin(fs: Any, url: str, options: dict[str, Any]) -> Any:
    """The response to a GET of `url` (to be used as an async context manager), with
    redirects followed only within the store's own server (`_same_server`): a
    chunk file had shown another server's bytes, any host or port a store's server
    named (the mount's `allow_redirects=False` keeps fsspec's own requests so too).
    RedirectRefusedError (EREMOTEIO) for any other redirect, or more than REDIRECTS_MAX."""
    session = await fs.set_session()
    here = url
    for _ in range(REDIRECTS_MAX + 1):
        response = await session.get(fs.encode_url(here), **{**options, "allow_redirects": False})
        if response.status not in _REDIRECTS:
            return response
        location = response.headers.get("Location", "")
        response.release()
        if not location:
            raise RedirectRefusedError(errno.EREMOTEIO, f"{source_label(url)}: the server answered "
                                       f"{response.status} with no Location: not followed")
        try:
            target = urllib.parse.urljoin(here, location)
        except ValueError:  # (no URL: "http://[::1/x")
            target = location
        if not _same_server(url, target):
            raise RedirectRefusedError(errno.EREMOTEIO, f"{source_label(url)}: the server redirected it to "
                                       f"{source_label(target)}: not followed (the store's objects are its own)")
        here = target
    raise RedirectRefusedError(errno.EREMOTEIO, f"{source_label(url)}: more than {REDIRECTS_MAX} redirects: "
                               "not followed")


async def _http_body(fs: Any, url: str, limit: int) -> tuple[bytes, str | None]:
    """(the body of `url`, decoded, of at most `limit` bytes; its Content-Type without
    parameters); FileNotFoundError if there is none."""
    async with await _get_same_origin(fs, url, fs.kwargs) as response:
        fs._raise_not_found_for_status(response, url)
        if response.content_length is not None and response.content_length > limit:
            raise too_large(url, limit)
        data = await read_whole(response.content, limit, url)
        encoding = _encoding(response)
        mimetype = response.headers.get("Content-Type", "").partition(";")[0] or None
    if encoding != "identity":  # (in a thread: the event loop serves every other request)
        data = await asyncio.to_thread(_inflate, data, encoding, limit, url)
    return data, mimetype


#: names of one http(s) directory page kept at most (a page is read to NON_STREAMING_MAX)
HTTP_PAGE_LINKS_MAX = 200_000


def bound_http_listings(fs: Any) -> None:
    """Have fsspec's HTTPFileSystem `fs` (this instance: the mount's) read a directory
    page to NON_STREAMING_MAX bytes: it read the page whole, however long (an endless
    page took the daemon to 4 GB in 9 s), for every listing, `find` and `ls`."""
    if getattr(fs, "_zfuse_bounded_ls", False):
        return

    async def ls_real(url: str, detail: bool = True, **kwargs: Any) -> Any:
        return await _bounded_http_ls(fs, url, detail)

    fs._ls_real = ls_real
    fs._zfuse_bounded_ls = True


async def _bounded_http_ls(fs: Any, url: str, detail: bool) -> Any:
    """fsspec's `HTTPFileSystem._ls_real` (the same links, named the same way), with the
    page read to a bound and its links counted."""
    from urllib.parse import urlparse

    from fsspec.implementations.http import ex, ex2

    page, mimetype = await _http_body(fs, url, NON_STREAMING_MAX)
    links: list[Any] = []
    if mimetype in ("text/html", None):
        text = page.decode("utf-8", "ignore")
        links = [u[2] for u in ex.findall(text)]
        if fs.simple_links:
            links = ex2.findall(text) + links
    if len(links) > HTTP_PAGE_LINKS_MAX:
        raise CorruptDataError(f"{url}: the directory page has {len(links)} links, more than the "
                               f"{HTTP_PAGE_LINKS_MAX} zfuse lists")
    out: set[str] = set()
    parts = urlparse(url)
    for link in links:
        if isinstance(link, tuple):
            link = link[1]
        if link.startswith("/") and len(link) > 1:
            link = f"{parts.scheme}://{parts.netloc}{link}"  # absolute on this server
        if link.startswith("http"):
            if (fs.same_schema and link.startswith(url.rstrip("/") + "/")) or \
                    link.replace("https", "http").startswith(url.replace("https", "http").rstrip("/") + "/"):
                out.add(link)
        elif link not in ("..", "../"):
            out.add("/".join([url.rstrip("/"), link.lstrip("/")]))
    if not out and url.endswith("/"):
        return await _bounded_http_ls(fs, url.rstrip("/"), detail)
    if detail:
        return [{"name": u, "size": None, "type": "directory" if u.endswith("/") else "file"} for u in out]
    return sorted(out)


async def get_http_range(fs: Any, url: str, byte_range: ByteRequest) -> bytes | None:
    """A byte range of the http(s) object at `url` through fsspec's HTTPFileSystem `fs`
    (its session and options); None if there is none. A server without ranges (Python's
    http.server) answers 200 with the whole file: the range is then taken from it as it
    streams (fsspec's own read would hand back the whole body as the range)."""
    http_range = _http_range(byte_range)
    if http_range is None:
        return b""  # an empty range
    options = dict(fs.kwargs)
    options["headers"] = {**options.get("headers", {}), "Range": http_range}
    async with await _get_same_origin(fs, url, options) as response:
        if response.status == 416:
            return b""  # (a range past the end, as FsspecStore answers it)
        try:
            fs._raise_not_found_for_status(response, url)
        except FileNotFoundError:
            return None
        _refuse_encoded(response, url)
        if response.status == 206:
            length = check_content_range(url, byte_range, response.headers.get("Content-Range"))
            return check_length(url, await _read_at_most(response.content, length), length)
        parts = urllib.parse.urlsplit(url)
        note_range_ignored(f"{parts.scheme}://{parts.hostname}:{parts.port}", url)
        return await _range_of_whole_object(response.content, byte_range)


async def http_head(fs: Any, url: str) -> tuple[bool, dict[str, Any]]:
    """Whether the http(s) object at `url` exists, and what its answer says of it (ETag,
    Last-Modified, size: `_version_of` reads them): its answer's status alone (one byte
    asked for, none read; a 404 is none, a failure raises). fsspec's exists and info
    answered "none" for any failure: a server failing a lookup had read as "no such file"."""
    options = dict(fs.kwargs)
    options["headers"] = {**options.get("headers", {}), "Range": "bytes=0-0"}
    async with await _get_same_origin(fs, url, options) as response:
        if response.status != 416:  # (an empty object: no byte 0)
            try:
                fs._raise_not_found_for_status(response, url)
            except FileNotFoundError:
                return False, {}
        info: dict[str, Any] = {key: response.headers[key] for key in ("ETag", "Last-Modified")
                                if key in response.headers}
        total = str(response.headers.get("Content-Range", "")).rpartition("/")[2]
        if total.isdigit():
            info["size"] = int(total)
        elif response.status == 200 and response.content_length is not None:
            info["size"] = response.content_length  # (a server without ranges: the whole object's)
        return True, info


def _http_range(byte_range: ByteRequest | None) -> str | None:
    if byte_range is None:
        return None
    if isinstance(byte_range, RangeByteRequest):
        return f"bytes={byte_range.start}-{byte_range.end - 1}" if byte_range.end > byte_range.start else None
    if isinstance(byte_range, OffsetByteRequest):
        return f"bytes={byte_range.offset}-"
    if isinstance(byte_range, SuffixByteRequest):
        return f"bytes=-{byte_range.suffix}"
    raise TypeError(f"Unexpected byte_range, got {byte_range}.")


class RemoteObjects:
    """A remote FsspecStore's objects with their versions (see above). Reads of any
    fsspec store; `can_put` (S3, writable) says whether `put` writes with PutObject and
    returns the new ETag. `cache_dir`/`cache_limit`: the mount's disk cache, if any."""

    def __init__(self, store: Any, protocol: str, cache_dir: str | None, cache_limit: int) -> None:
        self.store = store
        self.fs = store.fs
        self.root = str(store.path).rstrip("/")
        self.s3 = protocol in S3_PROTOCOLS
        self.http = protocol in ("http", "https")
        self.can_put = self.s3 and not store.read_only
        if self.s3:
            bound_non_streaming_responses()
        # writes carry conditions (If-Match/If-None-Match): the store was found to honour
        # them (`settle_conditions`, after the probe `start_conditions_probe` started)
        self._conditional = False
        self._conditions_probe: Any = None  # the probe under way (a concurrent Future, ...), if any
        self.probe_cleanup: Any = None  # the probe object's deletion (a concurrent Future)
        self.cache_dir = cache_dir
        self._observed_client: Any = None  # the s3fs client whose tries `note_server_answer` sees
        self.cache_limit = cache_limit
        client_kwargs = getattr(self.fs, "client_kwargs", None) or {}
        endpoint = client_kwargs.get("endpoint_url") or getattr(self.fs, "endpoint_url", None) or ""
        # what a cache entry belongs to: the server and the object (never credentials)
        self._server = f"{protocol}|{endpoint}"  # (what a note about the server is keyed by)
        self._identity_base = f"{self._server}|{self.root}/"

    @property
    def conditional(self) -> bool:
        """Whether writes carry conditions. Asked before the probe has decided (not
        settled yet): yes, the safe answer (a store that ignores them loses nothing)."""
        return self._conditional or self._conditions_probe is not None

    @conditional.setter
    def conditional(self, value: bool) -> None:
        self._conditional = value

    def start_conditions_probe(self, source: str, last_writer_wins: bool) -> None:
        """Find out, in the background on zarr's event loop, whether the store honours
        conditional writes: a probe object written twice with If-None-Match: *, once
        with If-Match of a wrong ETag, then deleted; once per bucket and process. A mount
        opens the source's metadata meanwhile, and waits for both (`settle_conditions`),
        so the probe's round trips are not added to the metadata's."""
        from zfuse.ext.zarr_private import event_loop

        place = self._probe_place()
        if place in _probed:
            self._conditional = _decide_conditions(_probed[place], source, last_writer_wins)
            return
        self._conditions_probe = (asyncio.run_coroutine_threadsafe(_probe(self), event_loop()),
                                  place, source, last_writer_wins)

    def settle_conditions(self) -> None:
        """Wait for the probe `start_conditions_probe` started and apply its answer:
        ConditionsIgnoredError for a store that ignores conditions (unless the mount
        accepts that: `last_writer_wins`). A probe that failed decides nothing: writes
        stay conditional, and fail as the store answers them."""
        probe = self._conditions_probe
        if probe is None:
            return
        future, place, source, last_writer_wins = probe
        try:
            honoured = future.result(timeout=defaults.REMOTE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - any failure: undecided, logged
            log.warning("%s: could not find whether the store honours conditional writes (%s): "
                        "writes are made conditional", source_label(source), e)
            self._conditions_probe, self._conditional = None, True
            return
        _probed[place] = honoured
        self._conditions_probe = None
        self._conditional = _decide_conditions(honoured, source, last_writer_wins)

    def _probe_place(self) -> tuple[str, str]:
        return (self._identity_base, self.fs.split_path(self.path(""))[0])

    def path(self, key: str) -> str:
        return f"{self.root}/{key}".rstrip("/") if self.root else key

    async def _observe(self) -> None:
        """Have `note_server_answer` see every try of S3 requests (once per client
        s3fs makes; listings and zarr's own requests share the client)."""
        if self.s3:
            client = await self.fs.set_session()
            if client is not self._observed_client:
                client.meta.events.register("needs-retry.s3", note_server_answer)
                self._observed_client = client

    async def _call_s3(self, method: str, **kwargs: Any) -> Any:
        await self._observe()
        return await self.fs._call_s3(method, **kwargs)

    def identity(self, key: str, byte_range: ByteRequest | None) -> str:
        """What a cached byte range is of: server, object and range (the version apart)."""
        return f"{self._identity_base}{key}\n{_http_range(byte_range) or 'all'}"

    async def head(self, key: str) -> tuple[bool, str | None]:
        """(whether `key` is an object, its current version: None where the store gives
        none to trust)."""
        await self._observe()
        if self.http:  # (fsspec's info answered "none" for any failure, and took a 3xx for the object)
            found, info = await http_head(self.fs, self.path(key))
            return found, _version_of(info) if found else None
        try:
            info = await self.fs._info(self.path(key))
        except FileNotFoundError:
            return False, None
        if info.get("type") == "directory":
            return False, None
        return True, _version_of(info)

    async def get(self, key: str, byte_range: ByteRequest | None,
                  if_match: str | None = None,
                  on_bytes: Callable[[bytes], None] | None = None,
                  limit: int = defaults.REMOTE_OBJECT_MAX) -> tuple[bytes | None, str | None]:
        """(bytes, the version they are of); (None, None) if absent. Stores other than
        S3 give no version with the bytes: (bytes, None). `if_match`: the bytes must be
        of that version (S3: If-Match), else ObjectChangedError. `on_bytes`: called with
        each part of the body as it arrives, in order (all of it at once, off S3), once
        the response is known to be of the right version. `limit`: bytes of a whole
        object at most (S3, http: `too_large` past it, nothing more read)."""
        if self.http and byte_range is None:
            return await get_http_object(self.fs, self.path(key), limit), None
        if self.http and byte_range is not None:
            data = await get_http_range(self.fs, self.path(key), byte_range)
            if data is not None and on_bytes is not None and len(data) == _range_length(byte_range):
                on_bytes(data)  # (only bytes of the range's length: the caller checks the rest)
            return data, None
        if not self.s3:
            from zarr.core.buffer import default_buffer_prototype

            buf = await self.store.get(key, default_buffer_prototype(), byte_range)
            if buf is None:
                return None, None
            data = buf.to_bytes()
            if on_bytes is not None and isinstance(byte_range, RangeByteRequest) and \
                    len(data) == byte_range.end - byte_range.start:
                on_bytes(data)  # (only bytes of the right length: a server may ignore a Range)
            return data, None
        bucket, name, _ = self.fs.split_path(self.path(key))
        extra = {}
        http_range = _http_range(byte_range)
        if http_range is not None:
            extra["Range"] = http_range
        elif byte_range is not None:
            return b"", None  # an empty range
        if if_match:
            extra["IfMatch"] = if_match
        try:
            response = await self._call_s3("get_object", Bucket=bucket, Key=name, **extra)
        except FileNotFoundError:
            if if_match:
                raise ObjectChangedError(key) from None  # (deleted since)
            return None, None
        except OSError as e:
            if if_match and _precondition_failed(e):
                raise ObjectChangedError(key) from e
            if "InvalidRange" in str(e) or "not satisfiable" in str(e):
                return b"", None  # (what FsspecStore answers for a range past the end)
            raise
        body = response["Body"]
        version = etag(response.get("ETag"))
        answered_length = None
        if http_range is not None and response.get("ContentRange"):
            try:
                answered_length = check_content_range(self.path(key), byte_range, response.get("ContentRange"))
            except CorruptDataError:
                body.close()
                raise
        # no Content-Range: the whole object came (a proxy that drops Range headers, a
        # server that ignores them), however big: the range is taken from it as it streams
        whole = http_range is not None and not response.get("ContentRange")
        if on_bytes is not None and http_range is not None and not _answers_range(response, byte_range):
            on_bytes = None  # (then handed on whole, at the end, once its length is checked)
        try:
            if if_match and version and version != etag(if_match):
                raise ObjectChangedError(key)  # (a store that ignores If-Match on reads)
            if whole:
                assert byte_range is not None
                note_range_ignored(self._server, self.path(key))
                data = await _range_of_whole_object(body, byte_range)
            elif byte_range is None:
                if (response.get("ContentLength") or 0) > limit:
                    raise too_large(key, limit)
                data = await read_whole(body, limit, key)
            elif on_bytes is None:
                assert answered_length is not None  # (a range, with its Content-Range: not `whole`)
                data = await _read_at_most(body, answered_length)
            else:
                # the body part by part: a shard's inner chunks are handed on as they come
                # (decoded while the rest arrives), not when the last byte has
                parts = []
                while part := await body.read(STREAM_PART):
                    parts.append(part)
                    on_bytes(part)
                data = b"".join(parts)
            if answered_length is not None:
                check_length(self.path(key), data, answered_length)
        finally:
            body.close()
        return data, version

    async def put(self, key: str, data: bytes, condition: str | None = None) -> str | None:
        """Store `data` as `key` (S3 PutObject); the new object's version. `condition`: the
        version the object must still be (its ETag; ABSENT: none may exist), else
        WriteConflictError and nothing written; None: unconditional."""
        if len(data) > SINGLE_PUT_MAX and condition is None:
            from zarr.core.buffer import default_buffer_prototype

            await self.store.set(key, default_buffer_prototype().buffer.from_bytes(data))
            return None
        bucket, name, _ = self.fs.split_path(self.path(key))
        extra = {} if condition is None else {"IfNoneMatch": "*"} if condition == ABSENT else {"IfMatch": condition}
        try:
            response = await self._call_s3("put_object", Bucket=bucket, Key=name, Body=data, **extra)
        except OSError as e:
            if condition is not None and _precondition_failed(e):
                raise WriteConflictError(key) from e
            raise
        return etag(response.get("ETag"))

    async def not_modified(self, key: str, byte_range: ByteRequest | None, version: str) -> bool:
        """Whether `key` is still `version` (S3: a GET with If-None-Match answered 304 Not
        Modified, no bytes sent). False: it is another version, or absent."""
        bucket, name, _ = self.fs.split_path(self.path(key))
        extra = {"IfNoneMatch": version}
        http_range = _http_range(byte_range)
        if http_range is not None:
            extra["Range"] = http_range
        try:
            response = await self._call_s3("get_object", Bucket=bucket, Key=name, **extra)
        except FileNotFoundError:
            return False
        except OSError as e:
            if http_status(e) == 304 or "Not Modified" in str(e):
                return True
            raise
        response["Body"].close()  # (another version: its bytes are fetched by the GET that follows)
        return False

    async def delete(self, key: str) -> None:
        bucket, name, _ = self.fs.split_path(self.path(key))
        await self._call_s3("delete_object", Bucket=bucket, Key=name)

    def iter_dir(self, prefix: str) -> AsyncIterator[tuple[str, str | None]]:
        """(name, version) of a directory's entries, as FsspecStore.list_dir names them
        (subdirectories have no version). On S3 page by page as the server sends them,
        each page waited for on its own (s3fs gathered every page first, under one
        timeout: a directory of 400,000 chunks could never be listed, and a listing that
        never ends grew the daemon 13 MB a second); elsewhere fsspec's one listing."""
        if self.s3:
            return self._pages(self.path(prefix.rstrip("/")) + "/", delimiter=True)
        return self._fsspec_dir(prefix)

    def iter_prefix(self, prefix: str) -> AsyncIterator[tuple[str, str | None]]:
        """(key, version) of every object whose key starts with `prefix` (relative to the
        store's root): on S3 page by page as `iter_dir`, elsewhere FsspecStore's listing."""
        if self.s3:
            return self._pages(f"{self.root}/{prefix}" if self.root else prefix, delimiter=False)
        return self._fsspec_prefix(prefix)

    async def _fsspec_dir(self, prefix: str) -> AsyncIterator[tuple[str, str | None]]:
        path = f"{self.root}/{prefix.rstrip('/')}" if self.root else prefix.rstrip("/")
        await self._observe()
        try:
            entries = await self.fs._ls(path, detail=True)
        except FileNotFoundError:
            return
        for entry in entries:
            name = entry["name"].replace(path + "/", "").removeprefix(self.root).removeprefix("/")
            yield name, None if entry.get("type") == "directory" else _version_of(entry)

    async def _fsspec_prefix(self, prefix: str) -> AsyncIterator[tuple[str, str | None]]:
        await self._observe()
        found = await self.fs._find(f"{self.root}/{prefix}", detail=True, maxdepth=None, withdirs=False)
        for name, info in found.items():
            yield name.removeprefix(f"{self.root}/"), _version_of(info)

    async def _pages(self, path: str, delimiter: bool) -> AsyncIterator[tuple[str, str | None]]:
        bucket, key, _ = self.fs.split_path(path)
        key += "/" if path.endswith("/") and key and not key.endswith("/") else ""
        # names relative to the directory listed, keys relative to the store's root
        root_key = self.fs.split_path(self.root)[1].rstrip("/") if self.root else ""
        strip = len(key) if delimiter else len(root_key + "/" if root_key else "")
        extra = {"Delimiter": "/"} if delimiter else {}
        # (not botocore's paginator: loading its model cost each new mount's first listing
        # ~0.1 s; a continuation token sent again is refused here)
        tokens: set[str] = set()
        token: str | None = None
        try:
            while True:
                page = await self._call_s3("list_objects_v2", Bucket=bucket, Prefix=key, **extra,
                                           **({"ContinuationToken": token} if token else {}))
                for common in page.get("CommonPrefixes") or ():
                    name = common.get("Prefix", "")[strip:].rstrip("/")
                    if name:
                        yield name, None
                for obj in page.get("Contents") or ():
                    name = obj.get("Key", "")[strip:]
                    if name:
                        yield name, etag(obj.get("ETag"))
                token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
                if not token:
                    return
                if token in tokens:  # (a listing that would never end)
                    raise CorruptDataError(f"listing {path}: the server sent continuation token {token[:40]!r} "
                                           "a second time")
                tokens.add(token)
        except FileNotFoundError:
            return  # (s3fs's translation of NoSuchKey/NoSuchBucket: nothing listed)


class WriteConflictError(OSError):
    """Another writer changed an object between this mount's read of it and its write
    (the store refused the conditional write): nothing was written. ESTALE, as NFS
    answers for a file changed on the server; the write path redoes a shard's or
    part's read-modify-write from the new version, and fails close() with it when
    that keeps losing."""

    def __init__(self, key: str) -> None:
        super().__init__(errno.ESTALE, f"{key}: changed by another writer since it was read "
                         "(the store refused the conditional write)")


class ObjectChangedError(OSError):
    """A byte range of an object that changed (another writer) since this mount read
    its version (and the shard index that gave the range): not read, since bytes of the
    new version at the old offsets are no chunk. ESTALE until the mount is reloaded
    (metadata_ttl, SIGHUP), which reads the new version's index."""

    def __init__(self, key: str) -> None:
        super().__init__(errno.ESTALE, f"{key}: changed on the store since this mount read it "
                         "(another writer): reload the mount (SIGHUP, zfuse reload, metadata_ttl) "
                         "to read the new version")


class ConditionsIgnoredError(ValueError):
    """A store that accepts conditional writes it does not check, mounted read-write
    without `-o last_writer_wins`."""


def http_status(exc: BaseException | None) -> int | None:
    """The HTTP status of a failed request: S3's (the botocore error s3fs translated)
    or aiohttp's (an http(s) store's); None if it got no answer, or it is unknown."""
    for cause in causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            return (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        status = getattr(cause, "status", None)
        if isinstance(status, int) and type(cause).__module__.startswith("aiohttp"):
            return status
    return None


def s3_redirect_refused(exc: BaseException) -> RedirectRefusedError | None:
    """The refusal of an S3 answer redirecting a request elsewhere (a 3xx with a
    `Location`, not followed: `follow_no_s3_redirects`), naming where; None for any
    other failure (AWS's 301 to a bucket's region has no `Location`: botocore's)."""
    for cause in causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            metadata = response.get("ResponseMetadata") or {}
            location = (metadata.get("HTTPHeaders") or {}).get("location")
            if metadata.get("HTTPStatusCode") in (301, 302, 303, 307, 308) and isinstance(location, str):
                return RedirectRefusedError(errno.EREMOTEIO, f"the server redirected it to "
                                            f"{source_label(location)}: not followed (the store's "
                                            "objects are its own)")
            return None
    return None


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a failed request was S3's answer to a condition that does not hold (412
    PreconditionFailed, or 409 ConditionalRequestConflict: a race between two of them)."""
    for cause in causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if error.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        if isinstance(cause, FileExistsError):  # (s3fs's translation of a failed If-None-Match)
            return True
    return False


# (endpoint, bucket) -> whether it honours conditions: each is probed once per process
_probed: dict[tuple[str, str], bool] = {}
PROBE_PREFIX = defaults.CONDITIONS_PROBE_PREFIX
PROBE_NAME_CHARS = string.ascii_lowercase + string.digits  # a probe object's name: the prefix and 12 of these


def _decide_conditions(honoured: bool, source: str, last_writer_wins: bool) -> bool:
    if honoured:
        return True
    if not last_writer_wins:
        raise ConditionsIgnoredError(
            f"{source_label(source)}: the store ignores conditional writes (If-Match, If-None-Match): "
            "two hosts writing one shard or part could silently lose an update. Mount it with "
            "-o ro, or with -o last_writer_wins to accept that (SEMANTICS [remote-3])")
    log.warning("%s: the store ignores conditional writes: mounted with last_writer_wins, two hosts "
                "writing one shard or part can lose an update", source_label(source))
    return False


async def _probe(remote: RemoteObjects) -> bool:
    key = PROBE_PREFIX + "".join(random.choices(PROBE_NAME_CHARS, k=12))
    version = await remote.put(key, b"zfuse probe 1", ABSENT)  # (failed: nothing to remove)
    try:
        # both must be refused: over an existing object (If-None-Match), on a wrong ETag
        # (If-Match); asked at once (one round trip: a mount waits for the probe)
        answers = await asyncio.gather(remote.put(key, b"zfuse probe 2", ABSENT),
                                       remote.put(key, b"zfuse probe 3", '"00000000000000000000000000000000"'),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, WriteConflictError):
                raise answer
        return version is not None and all(isinstance(a, WriteConflictError) for a in answers)
    finally:
        # deleted after the answer, not before it: the mount does not wait for this
        remote.probe_cleanup = asyncio.run_coroutine_threadsafe(_remove_probe(remote, key),
                                                                asyncio.get_running_loop())


async def _remove_probe(remote: RemoteObjects, key: str) -> None:
    try:
        await remote.delete(key)
    except Exception as e:  # noqa: BLE001 - logged: a probe object left behind
        log.warning("%s: could not remove the probe object: %s", remote.path(key), e)
