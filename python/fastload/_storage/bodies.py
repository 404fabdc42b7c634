"""A GET's body written to the cache's file: in chunks, held to the size expected and to the
source's check (a checksum), a short or refused body raised as Transient so that the retry
policy fetches it again. Shared by the clients that read bodies through Python."""
from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO, Callable

from .errors import Transient

if TYPE_CHECKING:
    from .urls import Url

CHUNK = 8 << 20  # bytes per read of a body


class BodyCheck:
    """A check of a body as it streams in (one pass: the bytes are not read back): start()
    before the first chunk, feed(chunk) for each, finish(out) at the end raises ValueError if the
    body is not what it must be (a checksum, a header), and the body is fetched again."""

    def start(self) -> None: ...

    def feed(self, chunk: memoryview) -> None: ...

    def finish(self, out: BinaryIO) -> None: ...


def write_body(read: Callable[[int], bytes], out: BinaryIO, expected: int | None, url: "Url",
               check: "BodyCheck | None" = None) -> int:
    """The body that read(n) returns, until b"", written to `out` from its start; its bytes."""
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
