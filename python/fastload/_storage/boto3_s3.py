"""S3 (and S3-compatible servers) through boto3: the client used where obstore is not installed,
or with storage_options={"client": "boto3"}. Kept beside obstore_s3.py for a tested reason: the
credential chain renewed on a refusal (credentials.py; tests/test_storage_credentials.py), which
obstore's own providers do not give for every boto3 profile, and for installs without obstore
(fastload[s3] needs only boto3). boto3's retries are off: RetryPolicy (retries.py) retries."""
from __future__ import annotations

import http.client
import io
import threading
import time
from typing import Any, BinaryIO, Callable, Mapping, TypeVar

from .bodies import range_total, write_body
from .client_protocol import BodyCheck, Client
from .credentials import aws_chain
from .deadline import body_limit, watched
from .errors import Transient, changed_error, refused_error
from .options import ALLOWED, check_options, setting
from .parts import configure_parts
from .retries import retry_policy
from .urls import Url

__all__ = ["S3Client"]

T = TypeVar("T")


class S3Client(Client):
    """boto3 with its retries off (RetryPolicy retries), one pooled client shared by the threads
    (botocore clients are thread-safe), a connection per concurrent request."""

    def __init__(self, options: Mapping[str, Any]):
        import boto3  # noqa: PLC0415 - only S3 users need it
        import botocore.config  # noqa: PLC0415
        from botocore import UNSIGNED  # noqa: PLC0415

        opts = check_options(options, ALLOWED["s3"], "s3")
        self.policy = retry_policy(opts)
        self.concurrency = setting(opts, "max_concurrency")
        # Parts only when asked: boto3 reads each part's body through Python into a buffer, one
        # copy more than a whole object streamed to the file (obstore hands out its own buffer).
        configure_parts(self, opts, "boto3")
        config = botocore.config.Config(
            # A connection for each request at once: the parts (parts.py) and the whole GETs.
            retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=2 * self.concurrency,
            connect_timeout=setting(opts, "connect_timeout"), read_timeout=setting(opts, "read_timeout"),
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
