"""The Client protocol: what the cache, the fetcher (fetcher.py, parts.py) and the file set
(file_set.py) ask of a store, declared once. One file per client: obstore_s3.py (S3 through
obstore, the default), boto3_s3.py (S3 through boto3), gcs.py and http.py (the standard
library); choose_client.py picks one per scheme. What they share lives beside this: the retry
policy around every request (retries.py), the body's writer and check (bodies.py), the
storage_options table, its checks and defaults (options.py), the errors (errors.py), the
credential chains (credentials.py).

A client subclasses Client to inherit the defaults below (get, requests_for, get_range,
unreadable); a class with the same members and no base also satisfies the protocol."""
from __future__ import annotations

from typing import Any, BinaryIO, Protocol, runtime_checkable

from .bodies import BodyCheck
from .parts import PartPool, get_in_parts, part_count
from .retries import RetryPolicy
from .urls import Url


@runtime_checkable
class Client(Protocol):
    """What the cache, the fetcher and the file set need of a store."""

    policy: RetryPolicy
    """The retry policy every request runs under (retries.py); parts.py retries a split object
    under it too."""
    concurrency: int
    """storage_options['max_concurrency']: requests at once per source (the fetcher's bound)."""
    requests: int
    """GETs sent, attempts included: the counter the tests and the fetcher's stats read."""
    part_size: int = 0
    """Bytes per ranged GET of a split object; 0 fetches every object whole (parts.configure_parts)."""
    parts_always: bool = False
    """part_size was given: every object of two parts or more is split (else the fetcher splits
    only where whole objects would leave requests unused)."""
    parts: PartPool
    """The threads that run this client's part requests (parts.py)."""

    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        """(object, bytes, version tag) of every object under the prefix taken as a folder
        ("tok" lists "tok/...", never "tok-old/..." or "tokenizer.bin"), in name order. The tag
        (the ETag, or GCS's generation) changes when an object is rewritten, so a cache keyed by
        it never serves the old bytes."""
        ...

    def stat(self, url: Url) -> tuple[int, str]:
        """(bytes, version tag) of one object."""
        ...

    def get_whole(self, url: Url, out: BinaryIO, expected: int | None = None,
                  check: BodyCheck | None = None, version: str | None = None) -> int:
        """The whole object written to `out` in one GET (retried from the start on a transient
        failure, `out` rewound); returns its bytes. A body shorter or longer than `expected`, or
        one that `check` refuses (a checksum), is fetched again. With `version` (the tag list or
        stat gave), an object rewritten since is ObjectChanged, never its new bytes."""
        ...

    def read_range(self, url: Url, start: int, end: int, version: str | None = None) -> tuple[Any, int | None]:
        """Bytes [start, end) of the object as a buffer (the client's own where it can, not a
        copy), and the object's size as the answer gave it (Content-Range; None where the server
        did not say). A short answer is fetched again; `version` as in get_whole."""
        ...

    # ------------------------------------------------------------------ defaults
    def get(self, url: Url, out: BinaryIO, expected: int | None = None,
            check: BodyCheck | None = None, version: str | None = None, parts: bool = True) -> int:
        """The whole object written to `out` (see get_whole); with `parts`, an object of
        `expected` bytes of at least two parts as ranged GETs in parallel (parts.py)."""
        if parts and expected is not None and part_count(expected, self.part_size) > 1:
            return get_in_parts(self, url, out, expected, check, version)
        return self.get_whole(url, out, expected, check, version)

    def requests_for(self, size: int) -> int:
        """How many requests an object of `size` bytes takes at once (its parts)."""
        return min(part_count(size, self.part_size), max(1, self.concurrency))

    def get_range(self, url: Url, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes [start, end) of the object, as bytes (read_range's buffer copied)."""
        return bytes(self.read_range(url, start, end, version)[0])

    def unreadable(self, url: Url) -> str | None:
        """Why this client cannot read the object (a message naming it), or None: checked at open
        for the objects a source reads, so that it fails there and says why."""
        return None
