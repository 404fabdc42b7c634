"""http(s):// objects through the standard library (HttpClient), and the request every client over
urllib makes (http_open, also gcs.py's): statuses turned into the clients' errors, a body read
within its deadline (deadline.py), and redirects that never carry credentials to another origin.

urllib follows a redirect with the request's headers, Authorization included, whatever the host
(a 302 to another host, or another port, received the user's token). Here a redirect to another
origin (scheme, host and port) drops Authorization, Cookie, Proxy-Authorization and every header
the user gave in storage_options, as curl and requests do; a redirect within the origin keeps them.

Hand-written, not obstore's HTTP store, for two tested reasons (obstore 0.12, measured in
tests/test_storage_obstore_limits.py against the same kind of servers):
- a redirect to another origin carries the user's own headers (an X-Api-Key) with obstore,
  whose HTTP client drops Authorization and Cookie only; fastload must drop them all
  (test_a_redirect_to_another_host_drops_the_users_headers_http);
- a ranged read of a server that ignores Range (Python's own file server) is an error with
  obstore; here the whole answer is taken and the range cut from it
  (test_http_urls_public_objects_and_a_plain_file_server reads Parquet footers from one).
Beside these, obstore's timeout bounds the whole request, where each body here has a deadline
that grows with its size (deadline.py; test_a_trickled_body_is_cut_at_its_deadline_and_retried
names that deadline in its error for http)."""
from __future__ import annotations

import http.client
import io
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO, Iterable, Mapping

from .bodies import range_total, write_body
from .client_protocol import BodyCheck, Client
from .deadline import body_limit, watched
from .errors import Refused, Transient, changed_error
from .options import ALLOWED, check_options, setting
from .parts import configure_parts
from .retries import retry_policy
from .urls import Url

CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, less the credentials when the target is another origin."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        private = getattr(req, "fastload_private", CREDENTIAL_HEADERS)
        if new is not None:
            new.fastload_private = private
            if _origin(newurl) != _origin(req.full_url):
                for name in [n for n in new.headers if n.lower() in private]:
                    del new.headers[name]
                for name in [n for n in new.unredirected_hdrs if n.lower() in private]:
                    del new.unredirected_hdrs[name]
        return new


_OPENER = urllib.request.build_opener(_Redirects)


def http_open(target: str, method: str, headers: Mapping[str, str], timeout: float, url: Url,
              version: str | None = None, private: Iterable[str] = ()) -> Any:
    """urlopen(target) with the statuses turned into the clients' errors (named by `url`, the
    object, not by `target`, which may carry a query); a 401/403 is Refused. `private`: names of
    headers (beside Authorization and cookies) a redirect to another origin must not carry."""
    req = urllib.request.Request(target, method=method, headers=dict(headers))
    req.fastload_private = CREDENTIAL_HEADERS | {h.lower() for h in private}  # type: ignore[attr-defined]
    try:
        return _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        label = f"HTTP {e.code} {e.reason}"
        if e.code == 404:
            raise FileNotFoundError(f"{url}: no such object ({label})") from None
        if e.code == 412 and version:
            raise changed_error(url, version) from None
        if e.code in (401, 403):
            raise Refused(f"{url}: access denied ({label})") from None
        if e.code >= 500 or e.code in (408, 429):
            raise Transient(label) from None
        raise OSError(f"{method} {url}: {label}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
        raise Transient(type(getattr(e, "reason", e)).__name__) from None


def read_response(r: Any, out: BinaryIO, expected: int | None, url: Url, check: BodyCheck | None,
                  started: float, read_timeout: float) -> int:
    """The body of `r` (a GET sent at `started`) written to `out`, within its deadline."""
    size = expected if expected is not None else _length(r)
    with watched(r.fileno, started, body_limit(read_timeout, size)) as watch:
        try:
            return write_body(r.read, out, expected, url, check)
        except (ConnectionError, TimeoutError, http.client.HTTPException, Transient) as e:
            if watch.fired:
                raise Transient(watch.label) from None
            raise e if isinstance(e, Transient) else Transient(type(e).__name__) from None


def _length(r: Any) -> int | None:
    n = r.headers.get("Content-Length")
    return int(n) if n and n.isdigit() else None


def answer_tag(r: Any) -> str:
    """The version tag of an answer as HttpClient.stat reads it: the ETag, else Last-Modified."""
    return r.headers.get("ETag") or r.headers.get("Last-Modified") or ""


class HttpClient(Client):
    """Plain HTTP(S) GETs (read-only, no listing) with the standard library; storage_options
    `headers` (an Authorization header, say) are sent and never shown, nor sent to another
    origin by a redirect."""

    def __init__(self, options: Mapping[str, Any]):
        opts = check_options(options, ALLOWED["http(s)"], "http(s)")
        self.policy = retry_policy(opts)
        self.concurrency = setting(opts, "max_concurrency")
        configure_parts(self, opts, "http(s)")  # a server may ignore Range and send it all: parts only when asked
        self._headers = dict(opts.get("headers") or {})
        self._timeout = setting(opts, "read_timeout")
        self._lock = threading.Lock()
        self.requests = 0

    def _open(self, url: Url, method: str, headers: Mapping[str, str] | None = None,
              version: str | None = None) -> Any:
        more = dict(headers or {})
        if version and version.startswith('"'):  # a strong ETag
            more["If-Match"] = version
        elif version and not version.startswith("W/"):  # Last-Modified (a weak ETag never matches If-Match)
            more["If-Unmodified-Since"] = version
        r = http_open(str(url), method, {**self._headers, **more}, self._timeout, url, version, self._headers)
        tag = answer_tag(r)
        if version and tag and tag != version:  # a server that ignores If-Match / If-Unmodified-Since
            r.close()
            raise changed_error(url, version)
        return r

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        raise ValueError(f"{prefix}: http(s):// has no listing; pass a list of URLs (or a dataset directory's "
                         "URL, whose manifest names its files)")

    def stat(self, url: Url) -> tuple[int, str]:
        def once() -> tuple[int, str]:
            with self._open(url, "HEAD") as r:
                n = r.headers.get("Content-Length")
                tag = answer_tag(r)
            if n is None:
                raise OSError(f"HEAD {url}: the server sent no Content-Length")
            return int(n), tag

        return self.policy.run("HEAD", url, once)

    def get_whole(self, url: Url, out: BinaryIO, expected: int | None = None,
                  check: BodyCheck | None = None, version: str | None = None) -> int:
        def once() -> int:
            with self._lock:
                self.requests += 1
            started = time.monotonic()
            with self._open(url, "GET", None, version) as r:
                return read_response(r, out, expected, url, check, started, self._timeout)

        return self.policy.run("GET", url, once)

    def read_range(self, url: Url, start: int, end: int, version: str | None = None) -> tuple[Any, int | None]:
        def once() -> tuple[Any, int | None]:
            with self._lock:
                self.requests += 1
            buf = io.BytesIO()
            started = time.monotonic()
            with self._open(url, "GET", {"Range": f"bytes={start}-{end - 1}"}, version) as r:
                if r.status == 206:
                    read_response(r, buf, end - start, url, None, started, self._timeout)
                    return buf.getbuffer(), range_total(r.headers.get("Content-Range"))
                read_response(r, buf, None, url, None, started, self._timeout)  # a server without ranges sends it all
            data = buf.getbuffer()
            if len(data) < end:
                raise Transient(f"truncated body: {len(data) - start} of {end - start} bytes")
            return data[start:end], len(data)

        return self.policy.run("GET", url, once)
