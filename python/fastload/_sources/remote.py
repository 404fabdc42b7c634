"""Remote sources: a dataset directory at a URL (Dataset.open("s3://bucket/prefix")) and token
files at URLs (Windows.from_files("s3://bucket/tokens/")). The URL is turned into local cached
paths at once: the manifest (or the listing) fixes every object's name, size and checksum, the
columns are the same lazily mapped shards a local directory past the mapping budget has, and the
collation threads map each file after the fetcher made it present (LazyFiles' provider).

Remote Parquet will come through the same seam: its row groups are objects the fetcher caches
and a Parquet source maps or reads (see docs/object-storage.md)."""
from __future__ import annotations

import concurrent.futures
import io
import os
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from .columns import describe_array
from .mapping import LazyTable
from .windows import TokenFiles
from .._storage.cache import Entry, ObjectCache, cache_key, default_cache_root, default_limit, parse_size
from .._storage.client import BodyCheck, Client, redacted_options
from .._storage.clients import make_client
from .._storage.fetcher import Fetcher, StorageStats
from .._storage.urls import Url, is_url, parse_url

_MAX_MANIFEST_BYTES = 1 << 30


def _folder(cache_dir: Any, key: str) -> str:
    # "~/cache" is the home folder's, as a shell reads it: not a folder named "~" here.
    base = default_cache_root() if cache_dir is None else os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    if base.startswith("/dev/shm"):
        raise ValueError(f"cache_dir {base!r} is under /dev/shm: the cache holds whole shards, which belong on a "
                         "disk, not in shared memory")
    return os.path.join(base, key)


def _limit(cache_limit: Any, root: str) -> int:
    return default_limit(root) if cache_limit is None else parse_size(cache_limit)


def _check_largest(limit: int, largest: int, url: Url) -> None:
    if largest > limit:
        raise ValueError(f"cache_limit is {limit} bytes, smaller than the largest shard of {url} ({largest} bytes): "
                         "raise cache_limit")


class _ShardCheck(BodyCheck):
    """A downloaded shard's check, as its body streams in: its .npy header is the manifest's,
    and its fl64 checksum too where the manifest has one (hashed while the bytes arrive)."""

    def __init__(self, f: Any, url: Url):
        self.f, self.url = f, url

    def start(self) -> None:
        from .. import _C  # noqa: PLC0415

        self.hash = _C.Checksum64() if self.f.checksum is not None else None
        self.at = 0

    def feed(self, chunk: memoryview) -> None:
        if self.hash is not None:
            first, end = self.f.offset, self.f.offset + self.f.nbytes  # the data bytes, after the header
            lo, hi = max(first - self.at, 0), min(end - self.at, len(chunk))
            if hi > lo:
                self.hash.update(chunk[lo:hi])
        self.at += len(chunk)

    def finish(self, out: Any) -> None:
        from .manifest import DatasetError  # noqa: PLC0415

        out.seek(0)
        try:
            self.f.check_header(out.read(self.f.offset))
        except DatasetError as e:
            raise ValueError(f"{self.url}: {str(e).split(': ', 1)[-1]}") from None
        if self.hash is not None:
            got = self.hash.hexdigest()
            if got != self.f.checksum:
                raise ValueError(f"{self.url}: checksum {got}, the manifest says {self.f.checksum}")


class RemoteDataset:
    """A dataset directory in object storage (see Dataset.open): its manifest read at open, its
    shards fetched into the cache as the plan needs them and mapped from there."""

    def __init__(self, url: str, verify: bool = False, pad: Any = 0, max_length: Any = None,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None, cache_limit: Any = None):
        from .directory import _Column, _LazyShards, _layout, _NameOnly, _per_column  # noqa: PLC0415
        from .manifest import MANIFEST, Bad, DatasetError, parse  # noqa: PLC0415
        from .shards import output_names  # noqa: PLC0415

        self._output_names, self._name_only, self._lazy_type = output_names, _NameOnly, _LazyShards
        self.url = url
        where = parse_url(url, "path")
        self._options = dict(storage_options or {})
        self._cache_dir, self._cache_limit = cache_dir, cache_limit
        client = make_client(where.scheme, self._options)
        murl = where.child(MANIFEST)
        buf = io.BytesIO()
        client.get(murl, buf)  # FileNotFoundError / PermissionError name the URL
        text = buf.getvalue()
        if len(text) > _MAX_MANIFEST_BYTES:
            raise DatasetError(f"{murl}: {len(text)} bytes, more than a manifest can be")
        self._digest = cache_key(text)
        try:
            manifest = parse(text)
            files: list[Any] = []
            columns, rows, total = _layout(_folder(cache_dir, self._digest), manifest, files.append)
        except Bad as e:
            where_field = f" field {e.field}:" if e.field else ""
            raise DatasetError(f"{murl}:{where_field} {e.message}") from None
        all_files = [one for col in columns for f in col.files for one in (f if isinstance(f, tuple) else (f,))]
        urls = [where.child(f.rel) for f in all_files]
        for u in urls:
            _check_readable(client, u)
        # Every GET is pinned to the version seen now, and the cache folder is keyed by those
        # versions too: a shard rewritten under the same manifest is an error, never new bytes
        # (for this process, or another that opened the dataset before the rewrite).
        versions = _shard_versions(client, where, urls, [f.offset + f.nbytes for f in all_files],
                                   [f.checksum is None for f in all_files])
        self._versions = versions
        root = _folder(cache_dir, cache_key(text, *[v.encode() for v in versions]))
        for f in all_files:
            f.path = os.path.join(root, f.rel)
        limit = _limit(cache_limit, root)
        cache = ObjectCache(root, limit)
        cache.put(MANIFEST, text)  # for people looking at the cache
        self.manifest = manifest
        self._columns: list[_Column] = columns
        self._shard_sizes = rows
        self._rows = total
        ragged = [c.name for c in columns if c.kind == "ragged"]
        self._pad = {n: _per_column("pad", pad, n, ragged) for n in ragged}
        self._max_length = {n: _per_column("max_length", max_length, n, ragged) for n in ragged}
        for f in all_files:
            f.identity = (0, 0, 0, 0)  # the provider gives each download's identity when it is mapped
        entries = [Entry(u, f.rel, f.offset + f.nbytes, _ShardCheck(f, u), v)
                   for f, u, v in zip(all_files, urls, versions)]
        index = {id(f): i for i, f in enumerate(all_files)}
        shard_files: list[list[int]] = [[] for _ in rows]
        for col in columns:
            for k, f in enumerate(col.files):
                shard_files[k] += [index[id(one)] for one in (f if isinstance(f, tuple) else (f,))]
        self._all_files = all_files
        fetcher = Fetcher(client, cache, entries, shard_files, limit)
        _check_largest(limit, int(fetcher.shard_bytes.max()), where)
        self._fetcher = fetcher
        self._lazy: Any = None
        self._lock = threading.Lock()
        self.cache_dir = root
        if verify:
            self.verify()

    def verify(self) -> None:
        """Fetches every shard not cached (each download is verified) and reads every cached one
        again: its .npy header and checksum against the manifest (DatasetError naming its URL)."""
        from .manifest import DatasetError  # noqa: PLC0415

        for i, entry in enumerate(self._fetcher.entries):
            self._fetcher.provide(i)
            check = entry.verify
            check.start()
            with open(self._fetcher.cache.path(entry.rel), "rb") as f:
                while True:
                    chunk = f.read(16 << 20)
                    if not chunk:
                        break
                    check.feed(memoryview(chunk))
                try:
                    check.finish(f)
                except ValueError as e:
                    raise DatasetError(f"{e} (the cached copy in {self.cache_dir} is corrupt: remove it)") from None

    def shard(self, k: int) -> dict[str, Any]:
        """Shard k's columns as arrays (a ragged column as (values, offsets)), fetched if needed
        and memory-mapped from the cache (an eviction later leaves these mappings valid)."""
        import copy  # noqa: PLC0415

        if not -len(self._shard_sizes) <= k < len(self._shard_sizes):
            raise IndexError(f"shard {k} out of range for {len(self._shard_sizes)} shards")
        index = {id(f): i for i, f in enumerate(self._all_files)}

        def mapped(f: Any) -> Any:
            self._fetcher.provide(index[id(f)])
            local = copy.copy(f)
            local.identity = None  # the download's own, whatever it is
            return local.map(True)

        out: dict[str, Any] = {}
        for col in self._columns:
            f = col.files[k]
            out[col.name] = mapped(f) if col.kind == "fixed" else (mapped(f[0]), mapped(f[1]))
        return out

    # ---------------------------------------------------------------- fastload.Source
    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        return self._output_names([self._name_only(c.name, c.kind == "ragged") for c in self._columns])

    @property
    def shard_rows(self) -> list[int] | None:
        return list(self._shard_sizes) if len(self._shard_sizes) > 1 else None

    @property
    def num_shards(self) -> int:
        return len(self._shard_sizes)

    def _shards(self) -> Any:
        with self._lock:
            if self._lazy is None:
                self._lazy = self._lazy_type(self._columns, self._all_files)
                self._fetcher.bind(self._lazy.table.files)
            return self._lazy

    def column_specs(self) -> list[Any]:
        lazy = self._shards()
        return [lazy.spec(col, k, self._shard_sizes, self._pad, self._max_length) for k, col in enumerate(self._columns)]

    def native_source(self) -> Any:
        from .columns import array_source  # noqa: PLC0415

        return array_source(self.column_specs())

    def fingerprint(self) -> list[Any]:
        return []  # every file is checked where it is mapped: the identity of its verified download

    def check_fingerprint(self, states: list[Any]) -> None:
        pass

    def _remote_fetcher(self) -> Fetcher:
        return self._fetcher

    def storage_stats(self) -> StorageStats:
        """Bytes fetched, requests, cache hits and misses, time waited, bytes/s, cache use."""
        return self._fetcher.stats()

    def __reduce__(self) -> tuple:
        # Credentials never travel: the unpickled source reads them from its process's chain.
        return _reopen, (self.url, self._pad, self._max_length, redacted_options(self._options), self._cache_dir,
                         self._cache_limit, self._digest, self._versions)

    def __deepcopy__(self, memo: dict) -> "RemoteDataset":
        return _reopen(self.url, dict(self._pad), dict(self._max_length), self._options, self._cache_dir,
                       self._cache_limit, self._digest, self._versions)

    def __repr__(self) -> str:
        cols = ", ".join(f"{c.name}: {c.dtype.name}{list(c.row_shape)}{' ragged' if c.kind == 'ragged' else ''}"
                         for c in self._columns)
        return f"Dataset.open({self.url!r}: {len(self)} samples in {len(self._shard_sizes)} shards; {cols})"


def _reopen(url: str, pad: Any, max_length: Any, options: dict, cache_dir: Any, cache_limit: Any,
            digest: str, versions: list[str] | None = None) -> RemoteDataset:
    """The dataset opened again in another process (or a copy): the same manifest and the same
    versions of its shards, or an error (a copy must never read other bytes than the original)."""
    from .manifest import DatasetError  # noqa: PLC0415

    ds = RemoteDataset(url, pad=pad, max_length=max_length, storage_options=options, cache_dir=cache_dir,
                       cache_limit=cache_limit)
    if ds._digest != digest:
        raise DatasetError(f"{url}: the dataset changed since this Dataset was pickled or copied (its manifest.json "
                           "differs); open it again")
    changed = _first_changed([e.url for e in ds._fetcher.entries], versions, ds._versions)
    if changed is not None:
        raise DatasetError(f"{changed}: the object changed since this Dataset was pickled or copied (its version "
                           "differs); open the dataset again")
    return ds


def _first_changed(urls: Sequence[Any], before: Sequence[str] | None, now: Sequence[str]) -> Any:
    """The first URL whose version differs between `before` (None: not recorded) and `now`."""
    if before is None:
        return None
    return next((u for u, a, b in zip(urls, before, now) if a != b), None)


def _shard_versions(client: Client, where: Url, urls: list[Url], sizes: list[int], unchecked: list[bool]) -> list[str]:
    """The version (ETag, generation) of each shard, every one checked to exist with the manifest's
    size (a missing one is FileNotFoundError naming its URL now, not at some later batch): s3://
    and gs:// from one listing of the prefix; http(s)://, which has no listing, by a HEAD of each
    shard that has no checksum in the manifest (one that has is held to it at every download)."""
    from .manifest import DatasetError  # noqa: PLC0415

    if where.scheme in ("s3", "gs"):
        listed = {u.key: (size, tag) for u, size, tag in client.list(where.child(""))}
        found = [listed.get(u.key) for u in urls]
    else:
        heads = [k for k, no_checksum in enumerate(unchecked) if no_checksum]
        found = [(n, "") for n in sizes]
        if heads:
            with concurrent.futures.ThreadPoolExecutor(max(1, min(client.concurrency, len(heads)))) as pool:
                for k, got in zip(heads, pool.map(lambda k: client.stat(urls[k]), heads)):
                    found[k] = got
    for u, n, got in zip(urls, sizes, found):
        if got is None:
            raise FileNotFoundError(f"{u}: no such object (the manifest names it)")
        if got[0] != n:
            raise DatasetError(f"{u}: {got[0]} bytes in storage, the manifest expects {n}")
    return [tag for _, tag in found]  # type: ignore[misc]


def _check_readable(client: Client, url: Url) -> None:
    reason = client.unreadable(url)
    if reason is not None:
        raise ValueError(reason)


# ------------------------------------------------------------------------------ token files
def _remote_urls(paths: Any, client_for: Any) -> tuple[list[Url], list[int], list[str], Client]:
    """(objects, their sizes, their version tags, the client) of a prefix (listed, in name
    order) or a list of URLs (HEAD each)."""
    if isinstance(paths, str):
        where = parse_url(paths, "paths")
        client = client_for(where.scheme)
        listed = [t for t in client.list(where) if not t[0].key.endswith("/")]  # the folder where/
        if not listed and where.key and not where.key.endswith("/"):
            try:  # not a folder: the object itself, as a local path names a file or a directory
                listed = [(where, *client.stat(where))]
            except FileNotFoundError:
                pass
        if not listed:
            raise FileNotFoundError(f"{paths}: no objects under this prefix")
        for u, _, _ in listed:
            _check_readable(client, u)
        return [u for u, _, _ in listed], [n for _, n, _ in listed], [t for _, _, t in listed], client
    urls = [parse_url(os.fspath(p), f"paths[{k}]") if is_url(p) else None for k, p in enumerate(paths)]
    if any(u is None for u in urls):
        k = urls.index(None)
        raise ValueError(f"paths mixes URLs and local paths (paths[{k}] = {paths[k]!r}): pass all of one kind")
    schemes = {u.scheme for u in urls}
    if len(schemes) > 1:
        raise ValueError(f"paths mixes URL schemes {sorted(schemes)}: pass one kind")
    client = client_for(urls[0].scheme)
    for u in urls:
        _check_readable(client, u)
    stats = [client.stat(u) for u in urls]
    return urls, [n for n, _ in stats], [t for _, t in stats], client


def remote_token_files(paths: Any, dtype: Any, row_shape: Sequence[int], storage_options: Mapping[str, Any] | None,
                       cache_dir: Any, cache_limit: Any) -> "RemoteTokenFiles":
    options = dict(storage_options or {})
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype, got {dtype!r}") from None
    shape = tuple(int(s) for s in row_shape)
    row = dt.itemsize * int(np.prod(shape, dtype=np.int64))
    urls, sizes, tags, client = _remote_urls(paths, lambda scheme: make_client(scheme, options))
    for u, size in zip(urls, sizes):
        if row == 0 or size % row:
            raise ValueError(f"{u}: {size} bytes is not a whole number of rows of {row} bytes ({dt} x {shape})")
    # Keyed by each object's version tag too: a file rewritten in place gets a new folder, never
    # the old file's cached bytes.
    key = cache_key(dt.str.encode(), *[f"{u} {n} {t}".encode() for u, n, t in zip(urls, sizes, tags)])
    root = _folder(cache_dir, key)
    limit = _limit(cache_limit, root)
    cache = ObjectCache(root, limit)
    rels = [f"{k:06d}-{os.path.basename(u.key) or 'object'}" for k, u in enumerate(urls)]
    # Every GET pinned to the version listed (or HEAD) now: a file rewritten since is an error
    # naming it, never its new bytes beside the old ones of the files still cached.
    entries = [Entry(u, rel, n, None, t) for u, rel, n, t in zip(urls, rels, sizes, tags)]
    fetcher = Fetcher(client, cache, entries, [[k] for k in range(len(urls))], limit)
    _check_largest(limit, max(sizes), urls[0])
    return RemoteTokenFiles([cache.path(r) for r in rels], sizes, dt, shape, row, fetcher,
                            ([str(u) for u in urls], dt.str, shape, redacted_options(options), cache_dir, cache_limit,
                             list(tags)))


class RemoteTokenFiles(TokenFiles):
    """Token files in object storage: TokenFiles (files the collation threads map on demand)
    whose files the fetcher makes present, verified, before each is mapped."""

    def __init__(self, paths: list[str], sizes: list[int], dtype: np.dtype, row_shape: tuple, row_bytes: int,
                 fetcher: Fetcher, reduced: tuple):  # noqa: super-init-not-called: nothing local to stat
        self.paths, self.dtype, self.row_shape = paths, dtype, row_shape
        self.rows = [n // row_bytes for n in sizes]
        self.template = describe_array("tokens", np.empty((0,) + row_shape, dtype=dtype), what="tokens")
        n = len(paths)
        self.table = LazyTable(paths, np.zeros(n, dtype=np.int64), sizes, np.zeros((n, 4), dtype=np.int64))
        self.fetcher = fetcher
        fetcher.bind(self.table.files)
        self._reduced = reduced

    def check(self) -> None:
        pass  # each file's identity is its verified download's, checked where it is mapped

    def reduce(self) -> tuple:
        return ("remote_token_files",) + self._reduced


def restore_token_files(reduced: tuple) -> RemoteTokenFiles:
    """An unpickled or copied remote Windows: HEAD again, same cache folder, and the same
    versions (a copy must never read other bytes than the original), else an error naming the
    file that changed."""
    _, urls, dtype, row_shape, options, cache_dir, cache_limit, *versions = reduced
    files = remote_token_files(list(urls), dtype, row_shape, options, cache_dir, cache_limit)
    changed = _first_changed(urls, versions[0] if versions else None, files._reduced[-1])
    if changed is not None:
        raise ValueError(f"{changed}: the object changed since this source was pickled or copied (its version "
                         "differs); open the token files again")
    return files
