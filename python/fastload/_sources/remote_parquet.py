"""Parquet files in object storage: `fl.Parquet("s3://bucket/prefix/")`, `gs://...`, or a list
of URLs. Opening reads the listing (or a HEAD per URL) and each file's footer with ranged GETs
(the last 64 KiB, and the rest of the footer if it is longer): the row groups, their rows and
the schema are known without fetching any file. The row groups are the shards, as for local
files; whole files are fetched into the bounded cache (_storage) by the fetcher, along this
rank's plan mapped from row groups to files, pinned to the version listed (an object rewritten
since is an error, never its new bytes), checked by size and by the footer read at open, and
decoded locally as local files are (parquet.Parquet)."""
from __future__ import annotations

import concurrent.futures
import io
import os
import threading
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from .parquet import Parquet, _dirs_of, _hidden, _import_pyarrow, register_url_class
from .remote import _folder, _limit, _remote_urls
from .._storage.cache import Entry, ObjectCache, cache_key
from .._storage.client import BodyCheck, Client, redacted_options
from .._storage.clients import make_client
from .._storage.fetcher import Fetcher, StorageStats
from .._storage.urls import Url, parse_url

_TAIL = 64 << 10  # bytes read from the end of each file at open: the footer, most of the time
_MAGIC = b"PAR1"


class _Footer(io.RawIOBase):
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


class _Opened(NamedTuple):
    """What parquet.Parquet reads of a file at open (as a footer-only ParquetFile has it)."""
    schema_arrow: Any
    metadata: Any


def _read_footer(client: Client, url: Url, size: int, version: str) -> tuple[_Opened, bytes]:
    """The file's metadata, and its footer's bytes (metadata, its length, the magic), from one
    ranged GET of its end (two if the footer is longer than that)."""
    if size < 12:
        raise ValueError(f"{url} is not a Parquet file ({size} bytes)")
    tail = client.get_range(url, max(0, size - _TAIL), size, version)
    if tail[-4:] != _MAGIC:
        raise ValueError(f"{url} is not a Parquet file (it does not end with PAR1)")
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > size - 4:
        raise ValueError(f"{url} is not a readable Parquet file (a footer of {need} bytes in {size})")
    if need > len(tail):
        tail = client.get_range(url, size - need, size - len(tail), version) + tail
    pq = _import_pyarrow()  # its ImportError names the pip command; not "not a readable Parquet file"
    try:
        meta = pq.read_metadata(_Footer(str(url), size, tail))  # reads within the tail only
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad footer
        raise ValueError(f"{url} is not a readable Parquet file ({e})") from None
    return _Opened(meta.schema.to_arrow_schema(), meta), tail[-need:]


class _FooterCheck(BodyCheck):
    """A download's end must be the footer read at open: the row groups planned are the file's."""

    def __init__(self, url: Url, size: int, footer: bytes):
        self.url, self.size, self.footer = url, size, footer

    def finish(self, out: Any) -> None:
        out.seek(self.size - len(self.footer))
        if out.read(len(self.footer)) != self.footer:
            raise ValueError(f"{self.url}: its footer differs from the one read when the source was opened")


class _Versioned:
    """The client, with each GET pinned to the version (ETag, GCS generation) listed at open."""

    def __init__(self, client: Client, versions: Mapping[str, str]):
        self._client, self._versions = client, versions

    def get(self, url: Url, out: Any, expected: int | None = None, check: BodyCheck | None = None,
            parts: bool = True) -> int:
        return self._client.get(url, out, expected, check, version=self._versions.get(str(url)) or None, parts=parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _Pins:
    """What the fetcher asks before it evicts a file (the LazyFiles protocol of the mapped
    sources): refused while a decoding thread is between "make it present" and "opened"."""

    def __init__(self, n: int):
        self._pins = np.zeros(n, dtype=np.int64)
        self._lock = threading.Lock()

    def set_provider(self, provide: Any) -> None:
        pass  # the decoding threads call the fetcher themselves (RemoteParquet._file)

    def pin(self, i: int, by: int) -> None:
        with self._lock:
            self._pins[i] += by

    def try_unmap(self, i: int) -> bool:
        with self._lock:
            return not self._pins[i]


class _ByFile:
    """The fetcher as the Loader's plan hooks see it (_storage/plan.py): they speak row groups
    (the source's shards), the fetcher files. Bytes per row group: its file's, shared among the
    file's row groups in proportion to their compressed sizes (exact for one row group a file)."""

    def __init__(self, fetcher: Fetcher, file_of_group: np.ndarray, group_bytes: np.ndarray):
        self._fetcher, self._file_of_group, self.shard_bytes = fetcher, file_of_group, group_bytes

    def start_epoch(self, seq: np.ndarray, position: Any, boundary: int | None = None, prefetch: bool = True) -> None:
        self._fetcher.start_epoch(self._file_of_group[np.asarray(seq, dtype=np.int64)], position, boundary, prefetch)

    def follow(self, plan: Any, position: Any, boundary: int | None = None) -> None:
        self._fetcher.follow(_FilePlan(plan, self._file_of_group), position, boundary)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fetcher, name)


class _FilePlan:
    """A plan of row groups (the Loader's, _storage/plan.py) as the fetcher reads it: of files."""

    def __init__(self, plan: Any, file_of_group: np.ndarray):
        self._plan, self._file_of_group = plan, file_of_group

    def window(self, at: int) -> Any:
        w = self._plan.window(at)
        return w._replace(shards=self._file_of_group[w.shards])


class RemoteParquet(Parquet):
    """fl.Parquet over URLs (see the module's docstring): storage_options, cache_dir and
    cache_limit as for Dataset.open over a URL."""

    def __init__(self, path: Any, columns: Sequence[str] | None = None, *, storage_options: Mapping[str, Any] | None = None,
                 cache_dir: Any = None, cache_limit: Any = None, **kwargs: Any):
        _import_pyarrow()  # without pyarrow: the pip command, before any request
        self._options = dict(storage_options or {})
        self._args = (path, columns, kwargs, cache_dir, cache_limit)
        urls, sizes, tags, client = _remote_urls(path, lambda scheme: make_client(scheme, self._options))
        if isinstance(path, str):  # a prefix: skip _SUCCESS, _metadata, .crc files, hidden folders
            base = parse_url(path, "path").key
            keep = [k for k, u in enumerate(urls) if not any(_hidden(part) for part in u.key[len(base):].split("/"))
                    and not u.key.endswith(".crc")]
            if not keep:
                raise ValueError(f"the prefix {path} holds no Parquet files")
            urls, sizes, tags = [urls[k] for k in keep], [sizes[k] for k in keep], [tags[k] for k in keep]
            # Hive partitions: the directory names below the prefix (as below a local directory).
            self._dirs = [_dirs_of(u.key[len(base):].rpartition("/")[0]) for u in urls]
        else:  # a list of URLs: every directory of each key (as for a list of local files)
            self._dirs = [_dirs_of(u.key.rpartition("/")[0]) for u in urls]
        self._urls, self._client = urls, client
        self._remote_states = [(str(u), n, t) for u, n, t in zip(urls, sizes, tags)]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(client.concurrency, len(urls)))) as pool:
            opened = list(pool.map(lambda a: _read_footer(client, *a), zip(urls, sizes, tags)))
        self._footers = [o for o, _ in opened]
        footers = [f for _, f in opened]

        key = cache_key(b"parquet", *[f"{u} {n} {t}".encode() for u, n, t in zip(urls, sizes, tags)])
        root = _folder(cache_dir, key)
        rels = [f"{k:06d}-{os.path.basename(u.key) or 'object'}" for k, u in enumerate(urls)]
        entries = [Entry(u, rel, n, _FooterCheck(u, n, f)) for u, rel, n, f in zip(urls, rels, sizes, footers)]
        limit = _limit(cache_limit, root)
        if max(sizes) > limit:
            raise ValueError(f"cache_limit is {limit} bytes, smaller than the largest Parquet file "
                             f"({max(sizes)} bytes, {urls[int(np.argmax(sizes))]}): raise cache_limit")
        self._cache = ObjectCache(root)
        versioned = _Versioned(client, {str(u): t for u, t in zip(urls, tags)})
        self._fetcher = Fetcher(versioned, self._cache, entries, [[k] for k in range(len(urls))], limit)  # type: ignore[arg-type]
        self._pins = _Pins(len(urls))
        self._fetcher.bind(self._pins)
        self.cache_dir = root
        super().__init__(path, columns, **kwargs)
        # The plan hooks see row groups: each maps to its file.
        file_of_group = np.array([k for k, _ in self._groups], dtype=np.int64)
        weight = np.array([max(1, self._footers[k].metadata.row_group(g).total_byte_size) for k, g in self._groups],
                          dtype=np.float64)
        per_file = np.bincount(file_of_group, weights=weight, minlength=len(urls))
        group_bytes = np.ceil(np.asarray(sizes, dtype=np.float64)[file_of_group] * weight / per_file[file_of_group])
        self._by_file = _ByFile(self._fetcher, file_of_group, group_bytes.astype(np.int64))

    # ---------------------------------------------------------------- the seam of parquet.Parquet
    def _locate(self, path: Any) -> list[tuple[str, list[str]]]:
        return [(str(u), dirs) for u, dirs in zip(self._urls, self._dirs)]

    def _state(self, k: int) -> Any:
        return self._remote_states[k]  # what was listed: each download is pinned to it

    def _footer(self, k: int) -> Any:
        return self._footers[k]

    def _fragment(self, k: int) -> Any:
        """File k made present in the cache (fetched now if the prefetcher has not) and mapped,
        as a pyarrow fragment over the mapping: once mapped, an eviction (an unlink) leaves the
        bytes readable. Made per decode (its footer is parsed again, well under a millisecond):
        a kept one would keep an evicted file's disk space."""
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.dataset as pads  # noqa: PLC0415

        for _ in range(3):  # a file another process evicted between the two steps is fetched again
            self._pins.pin(k, 1)
            try:
                # An object gone from the bucket is a FileNotFoundError naming its URL: raised as it is.
                self._fetcher.provide(k)
                try:
                    mapped = pa.memory_map(self._cache.path(self._fetcher.entries[k].rel)).read_buffer()
                except FileNotFoundError:  # the cached copy, evicted since it was made present
                    continue
            finally:
                self._pins.pin(k, -1)
            return pads.ParquetFileFormat().make_fragment(mapped)
        raise FileNotFoundError(f"{self._urls[k]}: its cached copy kept disappearing (another process evicts it)")

    # ---------------------------------------------------------------- object storage
    def _remote_fetcher(self) -> Any:
        # Partition columns only: no file is read, so none is fetched (the plan hooks skip a None).
        return self._by_file if self._read else None

    def storage_stats(self) -> StorageStats:
        """Bytes fetched, requests, cache hits and misses, time waited, bytes/s, cache use."""
        return self._fetcher.stats()

    def check_fingerprint(self, fp: Any) -> None:
        # No request here (it runs at every iter()): each download is pinned to the version
        # listed at open, so a rewritten object is refused when it is fetched, never read.
        if [tuple(s) for s in fp] != self._remote_states:
            raise ValueError("the Parquet files of this Loader are not those of its source: build a new Loader")

    def __reduce__(self) -> Any:
        # Credentials never travel: the unpickled source reads them from its process's chain. The
        # path as given (a prefix is listed again): the partition columns come from it.
        path, columns, kwargs, cache_dir, cache_limit = self._args
        return _reopen, (path, columns, kwargs, redacted_options(self._options), cache_dir, cache_limit,
                         self._remote_states)

    def __repr__(self) -> str:
        return "Remote" + super().__repr__()


def _reopen(path: Any, columns: Any, kwargs: dict, options: dict, cache_dir: Any, cache_limit: Any,
            states: list) -> RemoteParquet:
    source = RemoteParquet(path, columns, storage_options=options, cache_dir=cache_dir, cache_limit=cache_limit,
                           **kwargs)
    if source._remote_states != [tuple(s) for s in states]:
        raise ValueError(f"the Parquet files at {states[0][0]} ... changed since this source was pickled (objects "
                         "rewritten, added or removed): open them again")
    return source


register_url_class(RemoteParquet)  # fl.Parquet(url) builds a RemoteParquet
