"""Opening a dataset directory in object storage (Dataset.open("s3://bucket/prefix")), for the
one dataset-directory source (directory_source.py): the manifest is read at open and fixes every
object's name, size and checksum; the objects become a FileSet (_storage/file_set.py) of the
dataset's own layout, pinned to the versions listed now, each download checked against the
manifest, fetched into the cache as the Loader's order needs them. The source maps them as the
lazily mapped shards of a local directory past the mapping budget, after the fetcher made each
present."""
from __future__ import annotations

import concurrent.futures
import io
from typing import Any, Mapping

from .._storage.cache import cache_key
from .._storage.choose_client import make_client
from .._storage.client_protocol import Client
from .._storage.options import redacted_options
from .._storage.file_set import FileSet, cache_folder, cache_limit_of, check_cache_holds
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


class ObjectDirectory:
    """A dataset directory in object storage, as its source (directory_source.py) opens it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None,
                 cache_limit: Any = None):
        self.name = url
        self._options = dict(storage_options or {})
        self._cache_dir, self._cache_limit = cache_dir, cache_limit
        self.versions: list[str] | None = None
        self._urls_for_errors: list[str] = []
        self._cache_root = ""

    def load(self) -> Any:
        from .directory import DirectoryLayout, files_of, read_layout  # noqa: PLC0415
        from .manifest import MANIFEST, Bad, DatasetError, parse  # noqa: PLC0415

        where = parse_url(self.name, "path")
        cache_dir, cache_limit = self._cache_dir, self._cache_limit
        client = make_client(where.scheme, self._options)
        murl = where.child(MANIFEST)
        buf = io.BytesIO()
        client.get(murl, buf)  # FileNotFoundError / PermissionError name the URL
        text = buf.getvalue()
        if len(text) > _MAX_MANIFEST_BYTES:
            raise DatasetError(f"{murl}: {len(text)} bytes, more than a manifest can be")
        digest = cache_key(text)
        try:
            manifest = parse(text)
            columns, rows, total = read_layout(cache_folder(cache_dir, digest), manifest, lambda f: None)
        except Bad as e:
            where_field = f" field {e.field}:" if e.field else ""
            raise DatasetError(f"{murl}:{where_field} {e.message}") from None
        all_files = files_of(columns)
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
        self.versions = versions
        root = cache_folder(cache_dir, cache_key(text, *[v.encode() for v in versions]))
        limit = cache_limit_of(cache_limit, root)
        stored = FileSet.of_objects(client, urls, [f.offset + f.nbytes for f in all_files], versions,
                                    [f.rel for f in all_files], root, limit)
        for f, path in zip(all_files, stored.paths):
            f.path = path  # the cached copy; identity None: each download's own (the provider gives it)
        stored.cache.put(MANIFEST, text)  # for people looking at the cache
        self._urls_for_errors, self._cache_root = stored.names, root
        stored.verify_with([_ShardCheck(f, u) for f, u in zip(all_files, urls)])
        index = {id(f): i for i, f in enumerate(all_files)}
        shard_files: list[list[int]] = [[] for _ in rows]
        for col in columns:
            for k, f in enumerate(col.files):
                shard_files[k] += [index[id(one)] for one in (f if isinstance(f, tuple) else (f,))]
        stored.shards_read(units=shard_files)  # a shard's files (its columns') are fetched together
        check_cache_holds(limit, max(sum(f.offset + f.nbytes for f in (all_files[i] for i in one))
                                     for one in shard_files), where)
        return DirectoryLayout(manifest, columns, rows, total, digest, stored)

    def check_same(self) -> None:
        """Nothing to check: every file is pinned to its version (a rewrite is an error at its GET)."""

    def corrupt(self, k: int, error: Any) -> Any:
        """The error of a cached copy verify() found corrupt: naming its URL and the cache."""
        from .manifest import DatasetError  # noqa: PLC0415

        what = str(error).split(": ", 1)[-1]
        return DatasetError(f"{self._urls_for_errors[k]}: {what} (the cached copy in {self._cache_root} is corrupt: "
                            "remove it)")

    def reopen_options(self, for_pickle: bool) -> dict[str, Any]:
        """What opening it again takes; credentials never travel in a pickle (the unpickled source
        reads them from its process's chain)."""
        return {"storage_options": redacted_options(self._options) if for_pickle else dict(self._options),
                "cache_dir": self._cache_dir, "cache_limit": self._cache_limit}


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
