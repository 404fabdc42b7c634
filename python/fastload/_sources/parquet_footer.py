"""A Parquet file's footer read through its FileSet (_storage/file_set.py), without reading the
file: one ranged read of its end (two if the footer is longer), parsed by pyarrow. For a remote
file this is what makes opening cheap (row groups, rows and schema known before any fetch); the
footer's bytes then check every download of the file (FooterCheck)."""
from __future__ import annotations

import io
from typing import Any, NamedTuple

__all__ = ["Opened", "FooterCheck", "import_pyarrow", "read_footers"]

_TAIL = 64 << 10  # bytes read from the end of each file at open: the footer, most of the time
_MAGIC = b"PAR1"


def import_pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq  # noqa: PLC0415 - only Parquet needs it
    except ImportError:
        raise ImportError("fl.Parquet decodes row groups with pyarrow: pip install 'fastload[arrow]'") from None
    return pq


class _Tail(io.RawIOBase):
    """A file of `size` bytes of which only the last ones (`tail`) are here: what pyarrow needs
    to read the footer (a read elsewhere is an error, not a silent fetch)."""

    def __init__(self, name: str, size: int, tail: bytes):
        super().__init__()
        self.name, self.size, self.tail, self.at = name, size, tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = offset if whence == 0 else self.at + offset if whence == 1 else self.size + offset
        return self.at

    def tell(self) -> int:
        return self.at

    def readinto(self, b: Any) -> int:
        start = self.at - (self.size - len(self.tail))
        if start < 0:
            raise OSError(f"{self.name}: byte {self.at} is before the footer read at open")
        data = self.tail[start:start + len(b)]
        b[:len(data)] = data
        self.at += len(data)
        return len(data)


class Opened(NamedTuple):
    """What parquet.Parquet reads of a file at open (as a footer-only ParquetFile has it)."""
    schema_arrow: Any
    metadata: Any


def _parse(name: str, size: int, tail: bytes) -> tuple[Opened, bytes]:
    need = int.from_bytes(tail[-8:-4], "little") + 8
    pq = import_pyarrow()  # its ImportError names the pip command; not "not a readable Parquet file"
    try:
        meta = pq.read_metadata(_Tail(name, size, tail))  # reads within the tail only
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad footer
        raise ValueError(f"{name} is not a readable Parquet file ({e})") from None
    return Opened(meta.schema.to_arrow_schema(), meta), tail[-need:]


def read_footers(files: Any) -> list[tuple[Opened, bytes]]:
    """Each file's metadata and its footer's bytes (metadata, its length, the magic): one ranged
    read of every file's end, side by side, then a second one for the footers longer than that."""
    sizes = files.sizes
    for k, size in enumerate(sizes):
        if size < 12:
            raise ValueError(f"{files.names[k]} is not a Parquet file ({size} bytes; the smallest holds 12)")
    tails = files.read_ranges([(k, max(0, n - _TAIL), n) for k, n in enumerate(sizes)])
    more = []
    for k, (tail, size) in enumerate(zip(tails, sizes)):
        if tail[-4:] != _MAGIC:
            raise ValueError(f"{files.names[k]} is not a Parquet file (it does not end with PAR1)")
        need = int.from_bytes(tail[-8:-4], "little") + 8
        if need > size - 4:
            raise ValueError(f"{files.names[k]} is not a readable Parquet file (a footer of {need} bytes in {size})")
        if need > len(tail):
            more.append((k, size - need, size - len(tail)))
    for (k, _, _), head in zip(more, files.read_ranges(more)):
        tails[k] = head + tails[k]
    return [_parse(files.names[k], n, t) for k, (n, t) in enumerate(zip(sizes, tails))]


class FooterCheck:
    """A download's end must be the footer read at open: the row groups planned are the file's
    (a client_protocol.BodyCheck)."""

    def __init__(self, url: Any, size: int, footer: bytes):
        self.url, self.size, self.footer = url, size, footer

    def start(self) -> None:
        pass

    def feed(self, chunk: memoryview) -> None:
        pass

    def finish(self, out: Any) -> None:
        out.seek(self.size - len(self.footer))
        if out.read(len(self.footer)) != self.footer:
            raise ValueError(f"{self.url}: its footer differs from the one read when the source was opened")
