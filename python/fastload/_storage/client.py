"""What every client of object storage is and shares: the Client base (the protocol the cache,
the fetcher and the sources use), the retry policy around every request, the body's check and
writer, the option checks (the table: options.py; the errors: errors.py). One file per client:
boto3_s3.py (S3 through boto3), obstore_s3.py (S3 through obstore, the default), gcs.py and
http.py (the standard library); clients.py picks one per scheme.

Every request is retried here, not inside the client (boto3's own retries are switched off), so
that the error raised after the budget names the URL, the last status and the attempts made.
Credentials come from each cloud's standard chain (credentials.py: refreshed when they expire,
asked again when a server refuses them) or from storage_options; they are never part of a
message, a repr or a pickle (see redacted_options)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Mapping, TypeVar

from .cache import parse_size
from .parts import PartPool, get_in_parts, part_count
from .quiet import quiet
from .errors import FetchError, ObjectChanged, Refused, Transient, changed_error, refused_error  # noqa: F401 - re-exported
from .options import ALLOWED, DEFAULTS, SECRET_OPTIONS, setting  # noqa: F401 - SECRET_OPTIONS re-exported
from .urls import Url

T = TypeVar("T")
CHUNK = 8 << 20

S3_OPTIONS = ALLOWED["s3"]


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = DEFAULTS["max_attempts"]  # storage_options' defaults (options.py)
    backoff: float = DEFAULTS["backoff"]
    max_backoff: float = DEFAULTS["max_backoff"]

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
    return RetryPolicy(attempts, setting(options, "backoff"), setting(options, "max_backoff"))


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


def range_total(content_range: str | None) -> int | None:
    """The object's size from a Content-Range header ("bytes 0-99/1234"); None if unknown."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None
