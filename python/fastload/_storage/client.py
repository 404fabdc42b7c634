"""The clients that talk to object storage: S3 (and S3-compatible servers) through boto3, and
plain HTTP(S) through the standard library; one retry policy around both.

Every request is retried here, not inside the client (boto3's own retries are switched off), so
that the error raised after the budget names the URL, the last status and the attempts made.
Credentials come from boto3's standard chain (environment, config files, instance metadata; it
refreshes temporary ones) or from storage_options; they are never part of a message, a repr or
a pickle (see redacted_options)."""
from __future__ import annotations

import http.client
import os
import random
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Mapping, TypeVar

from .urls import Url

T = TypeVar("T")
_CHUNK = 8 << 20

# storage_options keys that hold credentials: accepted, used, never kept in a pickle or shown.
SECRET_OPTIONS = frozenset({"key", "secret", "token", "aws_access_key_id", "aws_secret_access_key",
                            "aws_session_token", "headers"})
_S3_OPTIONS = frozenset({"endpoint_url", "region_name", "profile", "anon", "max_attempts", "connect_timeout",
                         "read_timeout", "max_concurrency", "backoff", "max_backoff", "client"}) | SECRET_OPTIONS
_HTTP_OPTIONS = frozenset({"headers", "max_attempts", "connect_timeout", "read_timeout", "max_concurrency",
                           "backoff", "max_backoff"})


class FetchError(OSError):
    """A request that failed after its retry budget: names the URL, the last status, the attempts."""


class _Transient(Exception):
    """A failure worth retrying (a reset, a timeout, a 5xx, throttling, a short body)."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6  # tries in all, the first included
    backoff: float = 0.1  # seconds before the second try; doubled each time, with full jitter
    max_backoff: float = 5.0

    def run(self, what: str, url: Url, fn: Callable[[], T], on_retry: Callable[[], None] | None = None) -> T:
        """fn(), again after a jittered exponential backoff while it raises _Transient; after
        `attempts` tries a FetchError naming the URL, the last status and the attempts."""
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except _Transient as e:
                last = e.status
            if attempt < self.attempts:
                if on_retry is not None:
                    on_retry()
                time.sleep(random.uniform(0, min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))))
        raise FetchError(f"{what} {url} failed after {self.attempts} attempts; last: {last}")


def _check_options(options: Mapping[str, Any], allowed: frozenset, scheme: str) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:  # names only: a misspelt key may hold a secret
        raise ValueError(f"storage_options has keys {scheme}:// does not take: {unknown} (it takes "
                         f"{sorted(allowed)})")
    return dict(options)


def redacted_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """storage_options without its credentials: what a pickle, a repr or saved state may carry
    (an unpickled source takes credentials from the standard chain of the process it lands in)."""
    return {k: v for k, v in options.items() if k not in SECRET_OPTIONS}


def _policy(options: Mapping[str, Any]) -> RetryPolicy:
    attempts = options.get("max_attempts", RetryPolicy.attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"storage_options['max_attempts'] must be an integer >= 1, got {attempts!r}")
    return RetryPolicy(attempts, float(options.get("backoff", RetryPolicy.backoff)),
                       float(options.get("max_backoff", RetryPolicy.max_backoff)))


class Client:
    """What the cache and the sources need of a store."""

    policy: RetryPolicy
    concurrency: int
    requests: int  # GETs sent (attempts included): the counter tests and stats read

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        """(object, bytes, version tag) of every object under the prefix, in name order. The tag
        (the ETag) changes when an object is rewritten, so a cache keyed by it never serves the
        old bytes."""
        raise NotImplementedError

    def stat(self, url: Url) -> tuple[int, str]:
        """(bytes, version tag) of one object."""
        raise NotImplementedError

    def get(self, url: Url, out: BinaryIO, expected: int | None = None,
            check: BodyCheck | None = None) -> int:
        """The whole object written to `out` (retried from the start on a transient failure, `out`
        rewound); returns its bytes. A body shorter or longer than `expected`, or one that
        `check` refuses (a checksum), is fetched again."""
        raise NotImplementedError


class BodyCheck:
    """A check of a body as it streams in (one pass: the bytes are not read back): start()
    before the first chunk, feed(chunk) for each, finish(out) at the end raises ValueError if the
    body is not what it must be (a checksum, a header), and the body is fetched again."""

    def start(self) -> None: ...

    def feed(self, chunk: memoryview) -> None: ...

    def finish(self, out: BinaryIO) -> None: ...


def _write_body(read: Callable[[int], bytes], out: BinaryIO, expected: int | None, url: Url,
                check: BodyCheck | None = None) -> int:
    out.seek(0)
    out.truncate()
    if check is not None:
        check.start()
    n = 0
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            break
        view = memoryview(chunk)
        out.write(view)
        if check is not None:
            check.feed(view)
        n += len(view)
    if expected is not None and n != expected:
        raise _Transient(f"truncated body: {n} of {expected} bytes")
    if check is not None:
        out.flush()
        try:
            check.finish(out)
        except ValueError as e:
            raise _Transient(f"corrupt body ({e})") from None
    return n


class S3Client(Client):
    """boto3 with its retries off (RetryPolicy retries), one pooled client shared by the threads
    (botocore clients are thread-safe), a connection per concurrent request."""

    def __init__(self, options: Mapping[str, Any]):
        import boto3  # noqa: PLC0415 - only S3 users need it
        import botocore.config  # noqa: PLC0415
        from botocore import UNSIGNED  # noqa: PLC0415

        opts = _check_options(options, _S3_OPTIONS, "s3")
        self.policy = _policy(opts)
        self.concurrency = int(opts.get("max_concurrency", 16))
        config = botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=self.concurrency,
            connect_timeout=float(opts.get("connect_timeout", 10)), read_timeout=float(opts.get("read_timeout", 60)),
            signature_version=UNSIGNED if opts.get("anon") else None)
        session = boto3.session.Session(
            profile_name=opts.get("profile"),
            aws_access_key_id=opts.get("key", opts.get("aws_access_key_id")),
            aws_secret_access_key=opts.get("secret", opts.get("aws_secret_access_key")),
            aws_session_token=opts.get("token", opts.get("aws_session_token")))
        # endpoint_url None: boto3 reads AWS_ENDPOINT_URL (and AWS_ENDPOINT_URL_S3) itself.
        self._s3 = session.client("s3", endpoint_url=opts.get("endpoint_url"), region_name=opts.get("region_name"),
                                  config=config)
        self._lock = threading.Lock()
        self.requests = 0

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def _call(self, url: Url, what: str, fn: Callable[[], T]) -> T:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        def once() -> T:
            try:
                return fn()
            except ClientError as e:
                err = e.response.get("Error", {})
                code = str(err.get("Code", ""))
                status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                label = f"HTTP {status} {code}".strip()
                if status in (404,) or code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
                    raise FileNotFoundError(f"{url}: no such object or bucket ({label})") from None
                if status in (401, 403) or code in ("AccessDenied", "403", "InvalidAccessKeyId",
                                                    "SignatureDoesNotMatch", "ExpiredToken"):
                    raise PermissionError(f"{url}: access denied ({label}); check the credentials "
                                          "(environment, ~/.aws, instance role) and the bucket policy") from None
                if status >= 500 or status == 429 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                    raise _Transient(label) from None
                raise OSError(f"{what} {url}: {label}") from None
            except BotoCoreError as e:
                # Connection resets, timeouts, short reads: the class names the failure without
                # carrying request headers (which hold the signature) into the message.
                raise _Transient(type(e).__name__) from None
            except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
                raise _Transient(type(e).__name__) from None

        return self.policy.run(what, url, once)

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        out: list[tuple[Url, int, str]] = []
        token: str | None = None
        while True:
            args = {"Bucket": prefix.bucket, "Prefix": prefix.key}
            if token:
                args["ContinuationToken"] = token
            page = self._call(prefix, "listing", lambda: self._s3.list_objects_v2(**args))
            out += [(prefix._replace(key=o["Key"]), int(o["Size"]), str(o.get("ETag", "")))
                    for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        return sorted(out, key=lambda t: t[0].key)

    def stat(self, url: Url) -> tuple[int, str]:
        head = self._call(url, "HEAD", lambda: self._s3.head_object(Bucket=url.bucket, Key=url.key))
        return int(head["ContentLength"]), str(head.get("ETag", ""))

    def get(self, url: Url, out: BinaryIO, expected: int | None = None,
            check: BodyCheck | None = None) -> int:
        import urllib3.exceptions  # noqa: PLC0415 - botocore's transport

        def once() -> int:
            self._count()
            resp = self._s3.get_object(Bucket=url.bucket, Key=url.key)
            body = resp["Body"]
            try:
                return _write_body(body.read, out, expected, url, check)
            except urllib3.exceptions.HTTPError as e:
                raise _Transient(type(e).__name__) from None
            finally:
                body.close()

        return self._call(url, "GET", once)


class HttpClient(Client):
    """Plain HTTP(S) GETs (read-only, no listing) with the standard library; storage_options
    `headers` (an Authorization header, say) are sent and never shown."""

    def __init__(self, options: Mapping[str, Any]):
        opts = _check_options(options, _HTTP_OPTIONS, "http(s)")
        self.policy = _policy(opts)
        self.concurrency = int(opts.get("max_concurrency", 16))
        self._headers = dict(opts.get("headers") or {})
        self._timeout = float(opts.get("read_timeout", 60))
        self._lock = threading.Lock()
        self.requests = 0

    def _open(self, url: Url, method: str) -> Any:
        req = urllib.request.Request(str(url), method=method, headers=self._headers)
        try:
            return urllib.request.urlopen(req, timeout=self._timeout)  # noqa: S310 - http(s) only (parse_url)
        except urllib.error.HTTPError as e:
            e.close()
            label = f"HTTP {e.code} {e.reason}"
            if e.code == 404:
                raise FileNotFoundError(f"{url}: no such object ({label})") from None
            if e.code in (401, 403):
                raise PermissionError(f"{url}: access denied ({label})") from None
            if e.code >= 500 or e.code == 429:
                raise _Transient(label) from None
            raise OSError(f"{method} {url}: {label}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
            raise _Transient(type(getattr(e, "reason", e)).__name__) from None

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        raise ValueError(f"{prefix}: http(s):// has no listing; pass a list of URLs (or a dataset directory's "
                         "URL, whose manifest names its files)")

    def stat(self, url: Url) -> tuple[int, str]:
        def once() -> tuple[int, str]:
            with self._open(url, "HEAD") as r:
                n = r.headers.get("Content-Length")
                tag = r.headers.get("ETag") or r.headers.get("Last-Modified") or ""
            if n is None:
                raise OSError(f"HEAD {url}: the server sent no Content-Length")
            return int(n), tag

        return self.policy.run("HEAD", url, once)

    def get(self, url: Url, out: BinaryIO, expected: int | None = None,
            check: BodyCheck | None = None) -> int:
        def once() -> int:
            with self._lock:
                self.requests += 1
            with self._open(url, "GET") as r:
                try:
                    return _write_body(r.read, out, expected, url, check)
                except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
                    raise _Transient(type(e).__name__) from None

        return self.policy.run("GET", url, once)


_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>(\w+)</Code>")


class ObstoreS3Client(Client):
    """obstore (Rust's object_store): requests and body reads run in native code with the GIL
    released, which is why it is the default where it is installed (docs/object-storage.md has
    the measurement). Its own retries are off (RetryPolicy retries); credentials come from
    boto3's chain when boto3 is installed (config files and profiles included, refreshed when
    they expire), else from object_store's own (environment, instance metadata)."""

    def __init__(self, options: Mapping[str, Any]):
        import obstore  # noqa: PLC0415
        from obstore.store import S3Store  # noqa: PLC0415

        opts = _check_options(options, _S3_OPTIONS, "s3")
        self._obstore, self._store_type = obstore, S3Store
        self.policy = _policy(opts)
        self.concurrency = int(opts.get("max_concurrency", 16))
        endpoint = opts.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self._config: dict[str, Any] = {}
        if endpoint:
            self._config["endpoint"] = endpoint
        region = opts.get("region_name") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            self._config["region"] = region
        self._client_options = {"allow_http": bool(endpoint and endpoint.startswith("http:")),
                                "connect_timeout": f"{float(opts.get('connect_timeout', 10))}s",
                                "timeout": f"{float(opts.get('read_timeout', 60))}s"}
        self._provider = None
        key, secret = opts.get("key", opts.get("aws_access_key_id")), opts.get("secret", opts.get("aws_secret_access_key"))
        if opts.get("anon"):
            self._config["skip_signature"] = True
        elif key is not None or secret is not None:
            self._config.update(access_key_id=key, secret_access_key=secret)
            token = opts.get("token", opts.get("aws_session_token"))
            if token is not None:
                self._config["token"] = token
        else:
            self._provider = _boto3_credentials(opts.get("profile"))
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.requests = 0

    def _store(self, bucket: str) -> Any:
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                store = self._store_type(bucket, client_options=self._client_options, retry_config={"max_retries": 0},
                                         credential_provider=self._provider, **self._config)
                self._stores[bucket] = store
            return store

    def _call(self, url: Url, what: str, fn: Callable[[Any], T]) -> T:
        from obstore import exceptions as ox  # noqa: PLC0415

        def once() -> T:
            try:
                return fn(self._store(url.bucket))
            except (ox.PermissionDeniedError, ox.UnauthenticatedError):
                raise PermissionError(f"{url}: access denied; check the credentials (environment, ~/.aws, instance "
                                      "role) and the bucket policy") from None
            except FileNotFoundError as e:  # obstore's NotFoundError is one
                code = _CODE.search(str(e))
                raise FileNotFoundError(f"{url}: no such object or bucket (HTTP 404{' ' + code.group(1) if code else ''})") from None
            except ox.BaseError as e:
                # Only the status and the S3 error code are kept: the rest of the text is the
                # client's debug dump, which is no place to look for (or leak) anything.
                text = str(e)
                status = _STATUS.search(text)
                code = _CODE.search(text)
                label = " ".join(x for x in ("HTTP " + status.group(1) if status else "",
                                             code.group(1) if code else "") if x) or type(e).__name__
                n = int(status.group(1)) if status else 0
                if n in (401, 403):
                    raise PermissionError(f"{url}: access denied ({label})") from None
                if n == 404:
                    raise FileNotFoundError(f"{url}: no such object or bucket ({label})") from None
                if 400 <= n < 500 and n not in (408, 429):
                    raise OSError(f"{what} {url}: {label}") from None
                raise _Transient(label if status else "connection error") from None

        return self.policy.run(what, url, once)

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        def run(store: Any) -> list[tuple[Url, int, str]]:
            return [(prefix._replace(key=o["path"]), int(o["size"]), str(o.get("e_tag") or ""))
                    for page in self._obstore.list(store, prefix=prefix.key or None) for o in page]

        return sorted(self._call(prefix, "listing", run), key=lambda t: t[0].key)

    def stat(self, url: Url) -> tuple[int, str]:
        meta = self._call(url, "HEAD", lambda store: self._obstore.head(store, url.key))
        return int(meta["size"]), str(meta.get("e_tag") or "")

    def get(self, url: Url, out: BinaryIO, expected: int | None = None,
            check: BodyCheck | None = None) -> int:
        def run(store: Any) -> int:
            with self._lock:
                self.requests += 1
            result = self._obstore.get(store, url.key)
            return _write_body(_chunks(result.stream(min_chunk_size=_CHUNK)), out, expected, url, check)

        return self._call(url, "GET", run)


def _chunks(stream: Any) -> Callable[[int], bytes]:
    """A read(n) over an iterator of chunks (the stream decides their size)."""
    it = iter(stream)

    def read(_: int) -> bytes:
        return next(it, b"")

    return read


def _boto3_credentials(profile: str | None) -> Any:
    """obstore's credentials from boto3's standard chain (refreshed when they expire), or None
    (object_store's own chain) where boto3 is not installed or finds none."""
    try:
        import boto3  # noqa: PLC0415
    except ImportError:
        return None
    session = boto3.session.Session(profile_name=profile)
    credentials = session.get_credentials()
    if credentials is None:
        return None

    def provide() -> dict[str, Any]:
        frozen = credentials.get_frozen_credentials()  # refreshes temporary credentials
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": None}

    return provide


def make_client(scheme: str, options: Mapping[str, Any] | None) -> Client:
    """The client for a scheme. s3: storage_options["client"] "obstore" or "boto3"; default
    obstore where it is installed (measured ~3x boto3's parallel GETs), else boto3."""
    options = {} if options is None else options
    if scheme != "s3":
        return HttpClient(options)
    choice = options.get("client")
    if choice not in (None, "obstore", "boto3"):
        raise ValueError(f"storage_options['client'] must be 'obstore' or 'boto3', got {choice!r}")
    if choice is None:
        try:
            import obstore  # noqa: F401, PLC0415
            choice = "obstore"
        except ImportError:
            choice = "boto3"
    try:
        return ObstoreS3Client(options) if choice == "obstore" else S3Client(options)
    except ImportError:
        package = "obstore" if choice == "obstore" else "boto3"
        raise ImportError(f"s3:// URLs need {package}: pip install {package} (or fastload[s3])") from None
