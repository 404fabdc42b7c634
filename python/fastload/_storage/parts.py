"""A large object fetched as ranged GETs in parallel, each part written at its offset of the
cache's temporary file.

Why: the fetcher bounds the bytes in flight (they are reserved in the cache), and a small cache
of large shards (64 MiB shards, a 500 MB cache) leaves room for one or two whole objects in
flight: one or two connections, where object storage serves each at a fraction of a node's
bandwidth. Split into parts, the same bytes in flight are many requests, as s5cmd and boto3's
transfer manager do. Each part is retried on its own (a truncated part is fetched again); the
whole object is then checked once, read back from the page cache in order, and fetched again
if the check refuses it. Each answer's object size must be the size listed. Where the source pins
a version (Parquet files: the ETag or generation listed at open), every part carries it, so a
rewrite between parts is an ObjectChanged error; a dataset's shards are held to the manifest's
size, header and checksum instead."""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import TYPE_CHECKING, Any, BinaryIO, Mapping, Protocol

from .bodies import BodyCheck
from .cache import parse_size
from .errors import Transient
from .options import PART_SIZE
from .retries import RetryPolicy

if TYPE_CHECKING:
    from .urls import Url

_READ_BACK = 8 << 20  # the check reads the assembled file back in chunks of this size


class PartReader(Protocol):
    """What this module needs of a client (every Client is one; client_protocol.py declares the
    members). Declared here, not imported, because the Client's default get() calls this module."""

    policy: RetryPolicy
    concurrency: int
    part_size: int
    parts_always: bool
    parts: "PartPool"

    def read_range(self, url: "Url", start: int, end: int, version: str | None = None) -> tuple[Any, int | None]: ...


def part_count(size: int, part_size: int) -> int:
    """How many requests an object of `size` bytes takes (1: fetched whole). An object under
    two parts is fetched whole: a part is not worth its request below that."""
    if part_size <= 0 or size < 2 * part_size:
        return 1
    return -(-size // part_size)


def configure_parts(client: PartReader, options: Mapping[str, Any], name: str) -> None:
    """storage_options['part_size'] (else the default of client `name` in options.PART_SIZE):
    objects of at least two parts are fetched as ranged GETs of this size in parallel; 0 fetches
    every object whole. Not given, the fetcher splits objects only where whole ones would leave
    requests unused (fetcher.py)."""
    value = options.get("part_size", PART_SIZE[name])
    client.part_size = 0 if value == 0 else parse_size(value, "storage_options['part_size']")
    client.parts_always = client.part_size > 0 and "part_size" in options
    client.parts = PartPool(client.concurrency)


class PartPool:
    """The threads that run one client's part requests: as many as its max_concurrency. A
    thread that fetches a whole file (the fetcher's, or a collation thread on demand) waits
    here while its parts run, so parts never wait for the threads that wait for them."""

    def __init__(self, threads: int):
        self._threads = max(1, threads)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():  # a forked child has none of its parent's threads
                self._pool = concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="fastload-part")
                self._pid = os.getpid()
            return self._pool


def get_in_parts(client: PartReader, url: "Url", out: BinaryIO, size: int, check: "BodyCheck | None",
                 version: str | None) -> int:
    """The object of `size` bytes written to `out` by part_count(size) ranged GETs at once;
    its bytes. Raises what a part raised after its retries (naming the URL), and a FetchError
    once the check has refused the assembled object `client.policy.attempts` times."""
    part_size = client.part_size
    bounds = [(a, min(a + part_size, size)) for a in range(0, size, part_size)]
    fd = out.fileno()

    def fetch_part(start: int, end: int) -> None:
        data, total = client.read_range(url, start, end, version)
        if total is not None and total != size:  # a whole GET finds this by the body's length
            raise Transient(f"the object has {total} bytes, not {size}")
        view = memoryview(data)
        while len(view):  # pwrite may write less than asked
            view = view[os.pwrite(fd, view, start):]
            start = end - len(view)

    def once() -> int:
        out.seek(0)
        out.truncate()
        pool = client.parts.get()
        futures = [pool.submit(fetch_part, a, b) for a, b in bounds]
        _, pending = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        concurrent.futures.wait(pending)  # the running ones write to `out`: let them end first
        for f in futures:
            if not f.cancelled() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        if any(f.cancelled() for f in futures):  # never a file with a hole (a pool shut down at exit)
            raise OSError(f"GET {url}: stopped before every part was fetched")
        if check is not None:
            try:
                _check_file(fd, size, out, check)
            except ValueError as e:
                raise Transient(f"corrupt body ({e})") from None
        return size

    return client.policy.run("GET", url, once)


def _check_file(fd: int, size: int, out: BinaryIO, check: "BodyCheck") -> None:
    """The streaming check, fed from the assembled file in order (page-cache reads)."""
    check.start()
    buf = bytearray(min(_READ_BACK, size))
    at = 0
    while at < size:
        n = os.preadv(fd, [memoryview(buf)[:min(len(buf), size - at)]], at)
        if n <= 0:
            raise ValueError(f"the file ends at {at} of {size} bytes")
        check.feed(memoryview(buf)[:n])
        at += n
    check.finish(out)

