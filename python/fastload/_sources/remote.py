"""A dataset directory in object storage (Dataset.open("s3://bucket/prefix")): the manifest is
read at open and fixes every object's name, size and checksum; the objects become a FileSet
(_storage/file_set.py) of the dataset's own layout, pinned to the versions listed now, fetched
into the cache as the Loader's order needs them; the columns are the same lazily mapped shards a
local directory past the mapping budget has, and the collation threads map each file after the
fetcher made it present. Token files and Parquet at URLs are built on FileSet.resolve directly
(windows.py, parquet.py)."""
from __future__ import annotations

import concurrent.futures
import io
import threading
from typing import Any, Mapping, Sequence

from .._storage.cache import cache_key
from .._storage.choose_client import make_client
from .._storage.client_protocol import Client
from .._storage.options import redacted_options
from .._storage.file_set import FileSet, cache_folder, cache_limit_of, check_cache_holds
from .._storage.stats import StorageStats
from .._storage.urls import Url, parse_url

_MAX_MANIFEST_BYTES = 1 << 30


class _ShardCheck:
    """A downloaded shard's check (a client_protocol.BodyCheck), as its body streams in: its .npy header
    is the manifest's, and its fl64 checksum too where the manifest has one (hashed while the
    bytes arrive)."""

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
        from .directory import Column, LazyShards, NameOnly, per_column, read_layout  # noqa: PLC0415
        from .manifest import MANIFEST, Bad, DatasetError, parse  # noqa: PLC0415
        from .shards import output_names  # noqa: PLC0415

        self._output_names, self._name_only, self._lazy_type = output_names, NameOnly, LazyShards
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
            columns, rows, total = read_layout(cache_folder(cache_dir, self._digest), manifest, files.append)
        except Bad as e:
            where_field = f" field {e.field}:" if e.field else ""
            raise DatasetError(f"{murl}:{where_field} {e.message}") from None
        all_files = [one for col in columns for f in col.files for one in (f if isinstance(f, tuple) else (f,))]
        urls = [where.child(f.rel) for f in all_files]
        for u in urls:
            reason = client.unreadable(u)
            if reason is not None:
                raise ValueError(reason)
        # Every GET is pinned to the version seen now, and the cache folder is keyed by those
        # versions too: a shard rewritten under the same manifest is an error, never new bytes
        # (for this process, or another that opened the dataset before the rewrite).
        versions = _shard_versions(client, where, urls, [f.offset + f.nbytes for f in all_files],
                                   [f.checksum is None for f in all_files])
        self._versions = versions
        root = cache_folder(cache_dir, cache_key(text, *[v.encode() for v in versions]))
        limit = cache_limit_of(cache_limit, root)
        stored = FileSet.of_objects(client, urls, [f.offset + f.nbytes for f in all_files], versions,
                                    [f.rel for f in all_files], root, limit)
        for f, path in zip(all_files, stored.paths):
            f.path = path
        stored.cache.put(MANIFEST, text)  # for people looking at the cache
        self.manifest = manifest
        self._columns: list[Column] = columns
        self._shard_sizes = rows
        self._rows = total
        ragged = [c.name for c in columns if c.kind == "ragged"]
        self._pad = {n: per_column("pad", pad, n, ragged) for n in ragged}
        self._max_length = {n: per_column("max_length", max_length, n, ragged) for n in ragged}
        for f in all_files:
            f.identity = (0, 0, 0, 0)  # the provider gives each download's identity when it is mapped
        stored.verify_with([_ShardCheck(f, u) for f, u in zip(all_files, urls)])
        index = {id(f): i for i, f in enumerate(all_files)}
        shard_files: list[list[int]] = [[] for _ in rows]
        for col in columns:
            for k, f in enumerate(col.files):
                shard_files[k] += [index[id(one)] for one in (f if isinstance(f, tuple) else (f,))]
        self._all_files = all_files
        stored.shards_read(units=shard_files)  # a shard's files (its columns') are fetched together
        check_cache_holds(limit, max(sum(f.offset + f.nbytes for f in (all_files[i] for i in one))
                                     for one in shard_files), where)
        self._files = stored
        self._lazy: Any = None
        self._lock = threading.Lock()
        self.cache_dir = root
        if verify:
            self.verify()

    @property
    def _fetcher(self) -> Any:
        return self._files.fetcher

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
                self._files.provide_to(self._lazy.table.files)
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

    def stored_files(self) -> FileSet:
        """The shards' files, which follow the run's order (the Source protocol)."""
        return self._files

    def storage_stats(self) -> StorageStats:
        """Bytes fetched, requests, cache hits and misses, time waited, bytes/s, cache use."""
        return self._files.stats()

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
    changed = _first_changed(ds._files.names, versions, ds._versions)
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
