"""s3:// through obstore (Rust's object_store): requests and body reads run in native code with
the GIL released, which is why it is the default S3 client where it is installed. The retry
policy (retries.py), errors (errors.py) and version checks are those of every client."""
from __future__ import annotations

import os
import re
import threading
from typing import Any, BinaryIO, Callable, Mapping, TypeVar

from .boto3_s3 import S3Client
from .bodies import CHUNK, write_body
from .client_protocol import BodyCheck, Client
from .credentials import aws_chain, obstore_s3_provider
from .errors import Transient, changed_error, refused_error
from .options import ALLOWED, check_options, setting
from .parts import configure_parts
from .retries import retry_policy
from .urls import Url

T = TypeVar("T")

_UNNAMEABLE = ("obstore cannot read a key with an empty, '.' or '..' segment: pass storage_options={'client': "
               "'boto3'} (boto3 reads any key), or rename the object")
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>(\w+)</Code>")


class ObstoreS3Client(Client):
    """obstore (Rust's object_store): requests and body reads run in native code with the GIL
    released, which is why it is the default where it is installed (docs/object-storage.md has
    the measurement). Its own retries are off (RetryPolicy retries); credentials come from
    boto3's chain when boto3 is installed (config files and profiles included; refreshed when
    they expire, asked again when the server refuses them), else from object_store's own
    (environment, instance metadata)."""

    def __init__(self, options: Mapping[str, Any]):
        import obstore  # noqa: PLC0415
        from obstore.store import S3Store  # noqa: PLC0415

        opts = check_options(options, ALLOWED["s3"], "s3")
        self._options = opts  # for a listing obstore cannot make (list)
        self._obstore, self._store_type = obstore, S3Store
        self.policy = retry_policy(opts)
        self.concurrency = setting(opts, "max_concurrency")
        configure_parts(self, opts, "obstore")
        endpoint = opts.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self._config: dict[str, Any] = {}
        if endpoint:
            self._config["endpoint"] = endpoint
        region = opts.get("region_name") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            self._config["region"] = region
        self._client_options = {"allow_http": bool(endpoint and endpoint.startswith("http:")),
                                "connect_timeout": f"{setting(opts, 'connect_timeout')}s",
                                "timeout": f"{setting(opts, 'read_timeout')}s"}
        self._chain = None
        key, secret = opts.get("key", opts.get("aws_access_key_id")), opts.get("secret", opts.get("aws_secret_access_key"))
        if opts.get("anon"):
            self._config["skip_signature"] = True
        elif key is not None or secret is not None:
            self._config.update(access_key_id=key, secret_access_key=secret)
            token = opts.get("token", opts.get("aws_session_token"))
            if token is not None:
                self._config["token"] = token
        else:
            self._chain = aws_chain(opts.get("profile"))
        self._provider = None if self._chain is None else obstore_s3_provider(self._chain)
        self._stores: dict[str, tuple[Any, int]] = {}
        self._lock = threading.Lock()
        self.requests = 0

    def _store(self, bucket: str) -> tuple[Any, int]:
        """The bucket's store and the credentials' generation it was made with: a renewal makes
        new stores (obstore keeps the credentials it was given until their expiry)."""
        generation = 0 if self._chain is None else self._chain.generation
        with self._lock:
            got = self._stores.get(bucket)
        if got is None or got[1] != generation:
            # Made with no lock held (see credentials.Renewable.renew): a race makes two, one is kept.
            made = (self._make_store(bucket), generation)
            with self._lock:
                got = self._stores.get(bucket)
                if got is None or got[1] < generation:
                    got = self._stores[bucket] = made
        return got

    def _make_store(self, bucket: str) -> Any:
        return self._store_type(bucket, client_options=self._client_options, retry_config={"max_retries": 0},
                                credential_provider=self._provider, **self._config)

    def _call(self, url: Url, what: str, fn: Callable[[Any], T], version: str | None = None) -> T:
        from obstore import exceptions as ox  # noqa: PLC0415

        def once() -> T:
            for attempt in (0, 1):  # the second with renewed credentials
                store, generation = self._store(url.bucket)
                try:
                    return fn(store)
                except ox.PreconditionError:
                    if version is None:
                        raise OSError(f"{what} {url}: HTTP 412 precondition failed") from None
                    raise changed_error(url, version) from None
                except (ox.PermissionDeniedError, ox.UnauthenticatedError) as e:
                    label = _label(str(e), type(e).__name__)
                except ValueError as e:  # obstore's Path refuses the key before any request
                    if "parse path" not in str(e):
                        raise
                    raise ValueError(f"{url}: {_UNNAMEABLE}") from None
                except FileNotFoundError as e:  # obstore's NotFoundError is one
                    code = _CODE.search(str(e))
                    raise FileNotFoundError(f"{url}: no such object or bucket (HTTP 404{' ' + code.group(1) if code else ''})") from None
                except ox.BaseError as e:
                    # Only the status and the S3 error code are kept: the rest of the text is the
                    # client's debug dump, which is no place to look for (or leak) anything.
                    text = str(e)
                    status = _STATUS.search(text)
                    label = _label(text, type(e).__name__)
                    n = int(status.group(1)) if status else 0
                    if n == 404:
                        raise FileNotFoundError(f"{url}: no such object or bucket ({label})") from None
                    if n == 412 and version is not None:
                        raise changed_error(url, version) from None
                    if n not in (401, 403):
                        if 400 <= n < 500 and n not in (408, 429):
                            raise OSError(f"{what} {url}: {label}") from None
                        raise Transient(label if status else self._unanswered(text)) from None
                # Refused (401/403): the chain again, and once more with what it gives.
                if attempt == 0 and self._chain is not None and self._chain.renew(generation):
                    continue
                raise refused_error(url, label, self._chain is not None) from None
            raise AssertionError("unreachable")

        return self.policy.run(what, url, once)

    def _unanswered(self, text: str) -> str:
        """The label of a failure without an HTTP status (object_store's error kinds)."""
        if "kind: Timeout" in text:
            return (f"the request was not complete within read_timeout ({self._client_options['timeout']}: obstore "
                    "bounds the whole request, body included)")
        return "connection error"

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        from obstore.exceptions import InvalidPathError  # noqa: PLC0415

        prefix = prefix.child("")  # a folder ("tok/"): object_store's prefixes are folders too

        def run(store: Any) -> list[tuple[Url, int, str]] | str:
            try:
                return [(prefix._replace(key=o["path"]), int(o["size"]), str(o.get("e_tag") or ""))
                        for page in self._obstore.list(store, prefix=prefix.key or None) for o in page]
            except InvalidPathError as e:  # one key it cannot name fails the whole listing
                return str(e).partition("\n")[0]

        listed = self._call(prefix, "listing", run)
        if isinstance(listed, str):
            # A key the source may not even use (beside a dataset): boto3 lists every key.
            try:
                listed = S3Client({**self._options, "client": "boto3"}).list(prefix)
            except ImportError:
                raise OSError(f"listing {prefix}: {listed}; obstore cannot list a prefix that holds a key with "
                              "an empty, '.' or '..' segment: install boto3 (it lists any key), or remove that "
                              "key") from None
        return sorted(listed, key=lambda t: t[0].key)

    def unreadable(self, url: Url) -> str | None:
        if any(part in ("", ".", "..") for part in url.key.split("/")):
            return f"{url}: {_UNNAMEABLE}"
        return None

    def stat(self, url: Url) -> tuple[int, str]:
        meta = self._call(url, "HEAD", lambda store: self._obstore.head(store, url.key))
        return int(meta["size"]), str(meta.get("e_tag") or "")

    @staticmethod
    def _check_answer(result: Any, url: Url, version: str | None) -> None:
        tag = result.meta.get("e_tag") if version is not None else None
        if tag and tag != version:  # a server that ignores If-Match
            raise changed_error(url, version)  # type: ignore[arg-type]

    def get_whole(self, url: Url, out: BinaryIO, expected: int | None = None,
                  check: BodyCheck | None = None, version: str | None = None) -> int:
        options = {"if_match": version} if version is not None else None

        def run(store: Any) -> int:
            with self._lock:
                self.requests += 1
            result = self._obstore.get(store, url.key, options=options)
            self._check_answer(result, url, version)
            return write_body(_chunks(result.stream(min_chunk_size=CHUNK)), out, expected, url, check)

        return self._call(url, "GET", run, version)

    def read_range(self, url: Url, start: int, end: int, version: str | None = None) -> tuple[Any, int | None]:
        options: dict[str, Any] = {"range": (start, end)}
        if version is not None:
            options["if_match"] = version

        def run(store: Any) -> tuple[Any, int | None]:
            with self._lock:
                self.requests += 1
            result = self._obstore.get(store, url.key, options=options)
            self._check_answer(result, url, version)
            data = result.bytes()  # obstore's own buffer: no copy
            if len(data) != end - start:
                raise Transient(f"truncated body: {len(data)} of {end - start} bytes")
            return data, int(result.meta["size"])  # the object's (object_store reads Content-Range)

        return self._call(url, "GET", run, version)


def _label(text: str, fallback: str) -> str:
    """"HTTP <status> <S3 error code>" from a client's error text, or `fallback`."""
    status = _STATUS.search(text)
    code = _CODE.search(text)
    return " ".join(x for x in ("HTTP " + status.group(1) if status else "", code.group(1) if code else "") if x) \
        or fallback


def _chunks(stream: Any) -> Callable[[int], bytes]:
    """A read(n) over an iterator of chunks (the stream decides their size)."""
    it = iter(stream)

    def read(_: int) -> bytes:
        return next(it, b"")

    return read
