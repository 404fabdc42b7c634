"""The clients that talk to object storage: S3 (and S3-compatible servers) through boto3 (here)
or obstore (obstore_s3.py), GCS (gcs.py) and plain HTTP(S) (http.py) through the standard
library; one retry policy around all, and what they share (errors, options, the body's check).

Every request is retried here, not inside the client (boto3's own retries are switched off), so
that the error raised after the budget names the URL, the last status and the attempts made.
Credentials come from each cloud's standard chain (credentials.py: refreshed when they expire,
asked again when a server refuses them) or from storage_options; they are never part of a
message, a repr or a pickle (see redacted_options)."""
from __future__ import annotations

import http.client
import io
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Mapping, TypeVar

from .cache import parse_size
from .credentials import aws_chain
from .deadline import body_limit, watched
from .parts import PartPool, get_in_parts, part_count
from .quiet import quiet
from .errors import FetchError, ObjectChanged, Refused, Transient, changed_error, refused_error  # noqa: F401 - re-exported
from .urls import Url

T = TypeVar("T")
CHUNK = 8 << 20

# storage_options keys that hold credentials: accepted, used, never kept in a pickle or shown.
SECRET_OPTIONS = frozenset({"key", "secret", "token", "aws_access_key_id", "aws_secret_access_key",
                            "aws_session_token", "headers"})
S3_OPTIONS = frozenset({"endpoint_url", "region_name", "profile", "anon", "max_attempts", "connect_timeout",
                         "read_timeout", "max_concurrency", "backoff", "max_backoff", "client", "part_size"}) | SECRET_OPTIONS


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6  # tries in all, the first included
    backoff: float = 0.1  # seconds before the second try; doubled each time, with full jitter
    max_backoff: float = 5.0

    def run(self, what: str, url: Url, fn: Callable[[], T], on_retry: Callable[[], None] | None = None) -> T:
        """fn(), again after a jittered exponential backoff while it raises Transient; after
        `attempts` tries a FetchError naming the URL, the last status and the attempts."""
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                with quiet():  # no third-party debug log of the request (it holds credentials)
                    return fn()
            except Transient as e:
                last = e.status
            if attempt < self.attempts:
                if on_retry is not None:
                    on_retry()
                time.sleep(random.uniform(0, min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))))
        raise FetchError(f"{what} {url} failed after {self.attempts} attempts; last: {last}")


def check_options(options: Mapping[str, Any], allowed: frozenset, scheme: str) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:  # names only: a misspelt key may hold a secret
        raise ValueError(f"storage_options has keys {scheme}:// does not take: {unknown} (it takes "
                         f"{sorted(allowed)})")
    endpoint = options.get("endpoint_url")
    if isinstance(endpoint, str) and "@" in endpoint.partition("://")[2].partition("/")[0]:
        raise ValueError("storage_options['endpoint_url'] with a user name or password is refused (it would be "
                         "written into messages and saved state); pass credentials through storage_options (key, "
                         "secret, token) or the credential chain")
    return dict(options)


def redacted_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """storage_options without its credentials: what a pickle, a repr or saved state may carry
    (an unpickled source takes credentials from the standard chain of the process it lands in)."""
    return {k: v for k, v in options.items() if k not in SECRET_OPTIONS}


def retry_policy(options: Mapping[str, Any]) -> RetryPolicy:
    attempts = options.get("max_attempts", RetryPolicy.attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"storage_options['max_attempts'] must be an integer >= 1, got {attempts!r}")
    return RetryPolicy(attempts, float(options.get("backoff", RetryPolicy.backoff)),
                       float(options.get("max_backoff", RetryPolicy.max_backoff)))


def configure_parts(client: "Client", options: Mapping[str, Any], default: int) -> None:
    """storage_options['part_size']: objects of at least two parts are fetched as ranged GETs
    of this size in parallel (parts.py); 0 fetches every object whole. Without it, the fetcher
    splits objects only where whole ones would leave requests unused (fetcher.py)."""
    value = options.get("part_size", default)
    client.part_size = 0 if value == 0 else parse_size(value, "storage_options['part_size']")
    client.parts_always = client.part_size > 0 and "part_size" in options  # else the fetcher splits where it helps
    client.parts = PartPool(client.concurrency)


class Client:
    """What the cache and the sources need of a store."""

    policy: RetryPolicy
    concurrency: int
    requests: int  # GETs sent (attempts included): the counter tests and stats read
    part_size: int = 0  # configure_parts
    parts_always = False  # part_size was given: every object of two parts or more is split
    parts: PartPool

    def requests_for(self, size: int) -> int:
        """How many requests an object of `size` bytes takes at once (its parts)."""
        return min(part_count(size, self.part_size), max(1, self.concurrency))

    def get(self, url: Url, out: BinaryIO, expected: int | None = None,
            check: BodyCheck | None = None, version: str | None = None, parts: bool = True) -> int:
        """The whole object written to `out` (see get_whole); with `parts`, an object of
        `expected` bytes of at least two parts as ranged GETs in parallel (parts.py)."""
        if parts and expected is not None and part_count(expected, self.part_size) > 1:
            return get_in_parts(self, url, out, expected, check, version)
        return self.get_whole(url, out, expected, check, version)


    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        """(object, bytes, version tag) of every object under the prefix taken as a folder
        ("tok" lists "tok/...", never "tok-old/..." or "tokenizer.bin"), in name order. The tag
        (the ETag) changes when an object is rewritten, so a cache keyed by it never serves the
        old bytes."""
        raise NotImplementedError

    def stat(self, url: Url) -> tuple[int, str]:
        """(bytes, version tag) of one object."""
        raise NotImplementedError

    def unreadable(self, url: Url) -> str | None:
        """Why this client cannot read the object (a message naming it), or None: checked at open
        for the objects a source reads, so that it fails there and says why."""
        return None

    def get_whole(self, url: Url, out: BinaryIO, expected: int | None = None,
                  check: BodyCheck | None = None, version: str | None = None) -> int:
        """The whole object written to `out` in one GET (retried from the start on a transient failure, `out`
        rewound); returns its bytes. A body shorter or longer than `expected`, or one that
        `check` refuses (a checksum), is fetched again. With `version` (the tag list or stat
        gave), an object rewritten since is ObjectChanged, never its new bytes."""
        raise NotImplementedError

    def get_range(self, url: Url, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes [start, end) of the object (a short answer is fetched again)."""
        return bytes(self.read_range(url, start, end, version)[0])

    def read_range(self, url: Url, start: int, end: int, version: str | None = None) -> tuple[Any, int | None]:
        """get_range's bytes as a buffer (the client's own where it can, not a copy), and the
        object's size as the answer gave it (Content-Range; None where the server did not say)."""
        raise NotImplementedError


class BodyCheck:
    """A check of a body as it streams in (one pass: the bytes are not read back): start()
    before the first chunk, feed(chunk) for each, finish(out) at the end raises ValueError if the
    body is not what it must be (a checksum, a header), and the body is fetched again."""

    def start(self) -> None: ...

    def feed(self, chunk: memoryview) -> None: ...

    def finish(self, out: BinaryIO) -> None: ...


def write_body(read: Callable[[int], bytes], out: BinaryIO, expected: int | None, url: Url,
                check: BodyCheck | None = None) -> int:
    out.seek(0)
    out.truncate()
    if check is not None:
        check.start()
    n = 0
    while True:
        chunk = read(CHUNK)
        if not chunk:
            break
        view = memoryview(chunk)
        out.write(view)
        if check is not None:
            check.feed(view)
        n += len(view)
    if expected is not None and n != expected:
        raise Transient(f"truncated body: {n} of {expected} bytes")
    if check is not None:
        out.flush()
        try:
            check.finish(out)
        except ValueError as e:
            raise Transient(f"corrupt body ({e})") from None
    return n


class S3Client(Client):
    """boto3 with its retries off (RetryPolicy retries), one pooled client shared by the threads
    (botocore clients are thread-safe), a connection per concurrent request."""

    def __init__(self, options: Mapping[str, Any]):
        import boto3  # noqa: PLC0415 - only S3 users need it
        import botocore.config  # noqa: PLC0415
        from botocore import UNSIGNED  # noqa: PLC0415

        opts = check_options(options, S3_OPTIONS, "s3")
        self.policy = retry_policy(opts)
        self.concurrency = int(opts.get("max_concurrency", 16))
        # Parts only when asked: boto3 reads each part's body through Python into a buffer, one
        # copy more than a whole object streamed to the file (obstore hands out its own buffer).
        configure_parts(self, opts, 0)
        config = botocore.config.Config(
            # A connection for each request at once: the parts (parts.py) and the whole GETs.
            retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=2 * self.concurrency,
            connect_timeout=float(opts.get("connect_timeout", 10)), read_timeout=float(opts.get("read_timeout", 60)),
            signature_version=UNSIGNED if opts.get("anon") else None)
        self._read_timeout = config.read_timeout
        key = opts.get("key", opts.get("aws_access_key_id"))
        secret = opts.get("secret", opts.get("aws_secret_access_key"))
        # The chain (renewed when a server refuses its credentials) unless credentials are given.
        self._chain = None if opts.get("anon") or key is not None or secret is not None else aws_chain(opts.get("profile"))
        static = boto3.session.Session(profile_name=opts.get("profile"), aws_access_key_id=key,
                                       aws_secret_access_key=secret,
                                       aws_session_token=opts.get("token", opts.get("aws_session_token")))

        def make(session: Any) -> Any:
            # endpoint_url None: boto3 reads AWS_ENDPOINT_URL (and AWS_ENDPOINT_URL_S3) itself.
            return session.client("s3", endpoint_url=opts.get("endpoint_url"), region_name=opts.get("region_name"),
                                  config=config)

        self._make = make
        self._s3 = make(self._chain.creds[0] if self._chain is not None else static)
        self._generation = 0
        self._lock = threading.Lock()
        self.requests = 0

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def _client(self) -> tuple[Any, int]:
        with self._lock:
            return self._s3, self._generation

    def _renewed(self, generation: int) -> bool:
        """After a refusal of generation `generation`'s credentials: a client with new ones."""
        if self._chain is None or not self._chain.renew(generation):
            return False
        # Made with no lock held (see credentials.Renewable.renew); a race makes two, one is kept.
        session, latest = self._chain.creds[0], self._chain.generation
        s3 = self._make(session)
        with self._lock:
            if self._generation < latest:
                self._s3, self._generation = s3, latest
        return True

    def _call(self, url: Url, what: str, fn: Callable[[Any], T], version: str | None = None) -> T:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        def once() -> T:
            for attempt in (0, 1):  # the second with renewed credentials
                s3, generation = self._client()
                try:
                    return fn(s3)
                except ClientError as e:
                    err = e.response.get("Error", {})
                    code = str(err.get("Code", ""))
                    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                    label = f"HTTP {status} {code}".strip()
                    if status in (404,) or code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
                        raise FileNotFoundError(f"{url}: no such object or bucket ({label})") from None
                    if status == 412 and version is not None:
                        raise changed_error(url, version) from None
                    if status in (401, 403) or code in ("AccessDenied", "403", "InvalidAccessKeyId",
                                                        "SignatureDoesNotMatch", "ExpiredToken"):
                        if attempt == 0 and self._renewed(generation):
                            continue
                        raise refused_error(url, label, self._chain is not None) from None
                    if status >= 500 or status == 429 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                        raise Transient(label) from None
                    raise OSError(f"{what} {url}: {label}") from None
                except BotoCoreError as e:
                    # Connection resets, timeouts, short reads: the class names the failure without
                    # carrying request headers (which hold the signature) into the message.
                    raise Transient(type(e).__name__) from None
                except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
                    raise Transient(type(e).__name__) from None
            raise AssertionError("unreachable")

        return self.policy.run(what, url, once)

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        out: list[tuple[Url, int, str]] = []
        token: str | None = None
        prefix = prefix.child("")  # a folder: "tok/", never "tok-old/" or "tokenizer.bin"
        while True:
            args = {"Bucket": prefix.bucket, "Prefix": prefix.key}
            if token:
                args["ContinuationToken"] = token
            page = self._call(prefix, "listing", lambda s3: s3.list_objects_v2(**args))
            out += [(prefix._replace(key=o["Key"]), int(o["Size"]), str(o.get("ETag", "")))
                    for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        return sorted(out, key=lambda t: t[0].key)

    def stat(self, url: Url) -> tuple[int, str]:
        head = self._call(url, "HEAD", lambda s3: s3.head_object(Bucket=url.bucket, Key=url.key))
        return int(head["ContentLength"]), str(head.get("ETag", ""))

    def _get(self, url: Url, out: BinaryIO, expected: int | None, check: BodyCheck | None, version: str | None,
             range_: str | None = None, answer: dict | None = None) -> int:
        import urllib3.exceptions  # noqa: PLC0415 - botocore's transport

        args = {"Bucket": url.bucket, "Key": url.key}
        if version is not None:
            args["IfMatch"] = version
        if range_ is not None:
            args["Range"] = range_

        from botocore.exceptions import BotoCoreError  # noqa: PLC0415

        def once(s3: Any) -> int:
            self._count()
            started = time.monotonic()
            resp = s3.get_object(**args)
            if answer is not None:
                answer["total"] = range_total(resp.get("ContentRange"))
            if version is not None and resp.get("ETag") and resp["ETag"] != version:  # a server that ignores IfMatch
                resp["Body"].close()
                raise changed_error(url, version)
            body = resp["Body"]
            size = resp.get("ContentLength", expected)
            # botocore's body (its private _raw_stream) reads whole chunks: a trickle is cut by
            # the deadline (deadline.py).
            raw = getattr(body, "_raw_stream", None)
            try:
                with watched(lambda: raw.fileno(), started, body_limit(self._read_timeout, size)) as watch:
                    try:
                        return write_body(body.read, out, expected, url, check)
                    except (urllib3.exceptions.HTTPError, BotoCoreError, Transient) as e:
                        if watch.fired:
                            raise Transient(watch.label) from None
                        raise e if isinstance(e, Transient) else Transient(type(e).__name__) from None
            finally:
                body.close()

        return self._call(url, "GET", once, version)

    def get_whole(self, url: Url, out: BinaryIO, expected: int | None = None,
                  check: BodyCheck | None = None, version: str | None = None) -> int:
        return self._get(url, out, expected, check, version)

    def read_range(self, url: Url, start: int, end: int, version: str | None = None) -> tuple[Any, int | None]:
        buf, answer = io.BytesIO(), {}
        self._get(url, buf, end - start, None, version, f"bytes={start}-{end - 1}", answer)
        return buf.getbuffer(), answer["total"]


def range_total(content_range: str | None) -> int | None:
    """The object's size from a Content-Range header ("bytes 0-99/1234"); None if unknown."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None
