"""The files one source reads, named by local paths or by URLs: the one storage seam under every
file-backed source (Parquet, token files, tar shards). A source never branches on URLs itself:

    files = FileSet.resolve(path, what="path", kind="Parquet file", skip=hidden,
                            cache_dir=..., cache_limit=..., storage_options=..., salt=b"parquet")
    files.names[k], files.sizes[k]  # file k as the user knows it (a path or a URL), its bytes
    files.pins[k]                   # (name, size, mtime_ns, inode) locally; (url, size, version) remote
    files.folders[k]                # directory names below the folder listed (hive partitions)
    files.read_range(k, a, b)       # bytes [a, b) without fetching the file (a footer, a tar header)
    files.opened(k, open_fn)        # open_fn(local path): the file itself, or its copy fetched into
                                    # the cache (pinned to its version), not evicted while open_fn runs
    files.check(k)                  # ValueError if a local file changed since it was resolved

A folder (a local directory, a prefix `s3://b/tok`, which lists `tok/` only) is listed in name
order; a list names files (all local or all URLs of one scheme). Remote files are fetched whole
into a bounded cache by one fetcher (fetcher.py), which follows the Loader's order: the source
hands `files` to the Loader through its `stored_files()` member (the Source protocol), saying
which files each of its shards reads (`files.shards_read(...)`), and the Loader gives it the
run's order (plan.py)."""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from .options import redacted_options
from .urls import Url, is_url, parse_url

__all__ = ["FileSet", "is_remote", "cache_folder", "cache_limit_of", "local_pin", "redacted"]

T = TypeVar("T")
_OPEN_ATTEMPTS = 3  # a cached copy another process evicts between fetch and open is fetched again


def is_remote(given: Any) -> bool:
    """Whether `given` (a path, a URL, or a list of them) names objects by URL."""
    return is_url(given) or (isinstance(given, (list, tuple)) and any(is_url(p) for p in given))


def cache_folder(cache_dir: Any, key: str) -> str:
    """The cache folder of one source's objects under cache_dir (None: the per-user default)."""
    from .cache import default_cache_root  # noqa: PLC0415

    # "~/cache" is the home folder's, as a shell reads it: not a folder named "~" here.
    base = default_cache_root() if cache_dir is None else os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    if base.startswith("/dev/shm"):
        raise ValueError(f"cache_dir {base!r} is under /dev/shm: the cache holds whole shards, which belong on a "
                         "disk, not in shared memory")
    return os.path.join(base, key)


def cache_limit_of(cache_limit: Any, root: str) -> int:
    """cache_limit in bytes (None: half the free space where the cache is)."""
    from .cache import default_limit, parse_size  # noqa: PLC0415

    return default_limit(root) if cache_limit is None else parse_size(cache_limit)


def check_cache_holds(limit: int, largest: int, url: Any) -> None:
    """The one check, at open, that the cache holds the largest thing fetched at once."""
    from .cache import cache_too_small  # noqa: PLC0415

    if largest > limit:
        raise cache_too_small(limit, largest, f"smaller than the largest shard of {url} ({largest} bytes)")


def redacted(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """storage_options without its credentials (None stays None): what a pickle may carry."""
    return None if options is None else redacted_options(options)


def _dirs_of(folder: str) -> list[str]:
    return [d for d in folder.replace(os.sep, "/").split("/") if d not in ("", ".")]


# ------------------------------------------------------------------------------ local files
def _local_files(given: Any, what: str, kind: str, skip: Callable[[str], bool] | None,
                 in_list: bool = False) -> list[tuple[str, list[str]]]:
    """(path, directory names) of each file: a file as it is (its directories when named in a
    list, none alone: pyarrow's partition rules); a directory walked in name order, skipping
    entries `skip` refuses; a list, each of its entries."""
    if isinstance(given, (list, tuple)):
        if not given:
            raise ValueError(f"{what} must name at least one {kind}, got an empty list")
        out: list[tuple[str, list[str]]] = []
        for p in given:
            out += _local_files(p, what, kind, skip, in_list=True)
        return out
    if not isinstance(given, (str, os.PathLike)):
        raise TypeError(f"{what} must be a file, a directory or a list of them, got {type(given).__name__}")
    path = os.fspath(given)
    if os.path.isfile(path):
        return [(path, _dirs_of(os.path.dirname(path)) if in_list else [])]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no {kind} or directory at {path}")
    skip = skip or (lambda name: False)
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not skip(d))
        below = _dirs_of(os.path.relpath(root, path))
        found += [(os.path.join(root, f), below) for f in sorted(files) if not skip(f)]
    if not found:
        raise ValueError(f"the directory {path} holds no {kind}s")
    return found


def local_pin(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


# ------------------------------------------------------------------------------ objects
def _check_readable(client: Any, url: Url) -> None:
    reason = client.unreadable(url)
    if reason is not None:
        raise ValueError(reason)


def list_objects(given: Any, client_for: Callable[[str], Any], what: str = "paths") -> tuple[list[Url], list[int], list[str], Any]:
    """(objects, their sizes, their version tags, the client) of a prefix (listed as a folder,
    in name order; the object itself if it is no folder) or of a list of URLs (one HEAD each)."""
    if isinstance(given, str):
        where = parse_url(given, what)
        client = client_for(where.scheme)
        listed = [t for t in client.list(where) if not t[0].key.endswith("/")]  # the folder where/
        if not listed and where.key and not where.key.endswith("/"):
            try:  # not a folder: the object itself, as a local path names a file or a directory
                listed = [(where, *client.stat(where))]
            except FileNotFoundError:
                pass
        if not listed:
            raise FileNotFoundError(f"{given}: no objects under this prefix")
        for u, _, _ in listed:
            _check_readable(client, u)
        return [u for u, _, _ in listed], [n for _, n, _ in listed], [t for _, _, t in listed], client
    urls = [parse_url(os.fspath(p), f"{what}[{k}]") if is_url(p) else None for k, p in enumerate(given)]
    if any(u is None for u in urls):
        k = urls.index(None)
        raise ValueError(f"{what} mixes URLs and local paths ({what}[{k}] = {given[k]!r}): pass all of one kind")
    schemes = {u.scheme for u in urls}
    if len(schemes) > 1:
        raise ValueError(f"{what} mixes URL schemes {sorted(schemes)}: pass one kind")
    client = client_for(urls[0].scheme)
    for u in urls:
        _check_readable(client, u)
    stats = [client.stat(u) for u in urls]
    return urls, [n for n, _ in stats], [t for _, t in stats], client


class _Pins:
    """The fetcher's view of files a reader opens itself (LazyFiles' protocol): a file is not
    evicted while a reader is between "make it present" and "opened"."""

    def __init__(self, n: int):
        self._pins = np.zeros(n, dtype=np.int64)
        self._lock = threading.Lock()

    def set_provider(self, provide: Any) -> None:
        pass  # readers call the fetcher themselves (FileSet.opened)

    def pin(self, i: int, by: int) -> None:
        with self._lock:
            self._pins[i] += by

    def try_unmap(self, i: int) -> bool:
        with self._lock:
            return not self._pins[i]


class _NoPins:
    def pin(self, i: int, by: int) -> None:
        pass


_NO_PINS = _NoPins()


class FileSet:
    """Files resolved once (see the module's docstring). Built by FileSet.resolve."""

    def __init__(self, names: list[str], sizes: list[int], pins: list[tuple], folders: list[list[str]],
                 paths: list[str], *, client: Any = None, urls: Sequence[Url] = (), cache: Any = None,
                 limit: int = 0, rels: Sequence[str] = ()):
        self.names, self.sizes, self.pins, self.folders, self.paths = names, sizes, pins, folders, paths
        self.urls, self._rels = list(urls), list(rels)  # URLs: each file's name in the cache folder
        self.client, self.cache, self.limit = client, cache, limit
        self.cache_dir = cache.root if cache is not None else None
        self._checks: list[Any] = [None] * len(names)
        self._units: list[list[int]] | None = None  # the fetcher's shards: files fetched together
        self._unit_of_shard: np.ndarray | None = None  # the source's shard -> a unit (None: the same)
        self._shard_bytes: np.ndarray | None = None
        self.unit_per_sample = False  # the plan's sample ids are the units (an image folder: a file a sample)
        self._fetcher: Any = None
        self._opened_pins: _Pins | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ resolving
    @classmethod
    def resolve(cls, given: Any, *, what: str = "paths", kind: str = "file", skip: Callable[[str], bool] | None = None,
                list_folders: bool = True, cache_dir: Any = None, cache_limit: Any = None,
                storage_options: Mapping[str, Any] | None = None, salt: bytes = b"") -> "FileSet":
        """The files `given` names: a path or URL (a folder is listed), or a list of them.
        Local: at once, each stat'ed (list_folders=False: a list of file paths kept as given,
        stat'ed by the source itself). URLs: listed or HEAD now, each pinned to the version seen,
        fetched later into cache_dir/<key of salt and every (url, size, version)>."""
        if not is_remote(given):
            if storage_options is not None or cache_dir is not None or cache_limit is not None:
                raise ValueError("storage_options, cache_dir and cache_limit are for URLs (s3://, https://), "
                                 "not local paths")
            if not list_folders:  # kept as given: the source checks and stats them itself
                return cls([], [], [], [], given)
            found = _local_files(given, what, kind, skip)
            pins = [local_pin(p) for p, _ in found]
            return cls([p for p, _ in found], [pin[1] for pin in pins], pins, [d for _, d in found],
                       [p for p, _ in found])
        return cls._resolve_urls(given, what, kind, skip, cache_dir, cache_limit, dict(storage_options or {}), salt)

    @classmethod
    def _resolve_urls(cls, given: Any, what: str, kind: str, skip: Callable[[str], bool] | None, cache_dir: Any,
                      cache_limit: Any, options: dict, salt: bytes) -> "FileSet":
        from .cache import ObjectCache, cache_key  # noqa: PLC0415
        from .choose_client import make_client  # noqa: PLC0415

        urls, sizes, tags, client = list_objects(given, lambda scheme: make_client(scheme, options), what)
        if isinstance(given, str):  # a prefix: the directories below it
            base = parse_url(given, what).key
            rels = [u.key[len(base):] for u in urls]
            if skip is not None:
                keep = [k for k, rel in enumerate(rels) if not any(skip(part) for part in rel.split("/") if part)]
                if not keep:
                    raise ValueError(f"the prefix {given} holds no {kind}s")
                urls, sizes, tags, rels = ([x[k] for k in keep] for x in (urls, sizes, tags, rels))
            folders = [_dirs_of(rel.rpartition("/")[0]) for rel in rels]
        else:  # a list of URLs: every directory of each key (as for a list of local files)
            folders = [_dirs_of(u.key.rpartition("/")[0]) for u in urls]
        # Keyed by each object's version too: a file rewritten in place gets a new folder, never
        # the old file's cached bytes.
        root = cache_folder(cache_dir, cache_key(salt, *[f"{u} {n} {t}".encode() for u, n, t in zip(urls, sizes, tags)]))
        limit = cache_limit_of(cache_limit, root)
        check_cache_holds(limit, max(sizes), urls[int(np.argmax(sizes))])
        cache = ObjectCache(root, limit)  # made now: a cache_dir that cannot be made fails at open
        rels = [f"{k:06d}-{os.path.basename(u.key) or 'object'}" for k, u in enumerate(urls)]
        names = [str(u) for u in urls]
        return cls(names, list(sizes), [(n, s, t) for n, s, t in zip(names, sizes, tags)], folders,
                   [cache.path(r) for r in rels], client=client, urls=urls, cache=cache, limit=limit, rels=rels)

    @classmethod
    def of_objects(cls, client: Any, urls: Sequence[Url], sizes: Sequence[int], versions: Sequence[str],
                   rels: Sequence[str], root: str, limit: int) -> "FileSet":
        """Objects already known, with their versions (a manifest names them and the listing
        versioned them): fetched into root/rels[k] (a dataset directory's own layout)."""
        from .cache import ObjectCache  # noqa: PLC0415

        cache = ObjectCache(root, limit)
        names = [str(u) for u in urls]
        return cls(names, list(sizes), [(n, s, v) for n, s, v in zip(names, sizes, versions)], [[] for _ in names],
                   [cache.path(r) for r in rels], client=client, urls=urls, cache=cache, limit=limit, rels=rels)

    # ------------------------------------------------------------------ what a source asks
    def __len__(self) -> int:
        return len(self.names)

    @property
    def fetched(self) -> bool:
        """Whether the files are fetched into a cache (URLs): a present file may be evicted after
        use, so a reader maps it while it is present and keeps no path to it."""
        return self.client is not None

    def read_range(self, k: int, start: int, end: int) -> bytes:
        """Bytes [start, end) of file k, without fetching the whole file (pinned to its version)."""
        if not self.fetched:
            with open(self.paths[k], "rb") as f:
                f.seek(start)
                return f.read(end - start)
        return self.client.get_range(self.urls[k], start, end, self.pins[k][2] or None)

    def read_ranges(self, ranges: Sequence[tuple[int, int, int]]) -> list[bytes]:
        """read_range of each (k, start, end), side by side for URLs."""
        if not self.fetched or len(ranges) < 2:
            return [self.read_range(*r) for r in ranges]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(self.client.concurrency, len(ranges)))) as pool:
            return list(pool.map(lambda r: self.read_range(*r), ranges))

    def verify_with(self, checks: Sequence[Any]) -> None:
        """A client_protocol.BodyCheck per file (or None), run on every download of it (before any fetch)."""
        self._checks = list(checks)

    def current_pin(self, k: int) -> tuple:
        """File k's pin now: a local file stat'ed again; an object's is the one resolved (every
        GET is pinned to it, so a rewrite is an error when the object is fetched, never read)."""
        return local_pin(self.paths[k]) if not self.fetched else self.pins[k]

    def opened(self, k: int, open_fn: Callable[[str], T]) -> T:
        """open_fn(a local path holding file k's bytes): the file itself, or its cached copy,
        fetched now if the prefetcher has not (an object gone is a FileNotFoundError naming its
        URL) and kept in the cache while open_fn runs. What open_fn returns (a mapping) stays
        valid after an eviction (an unlink)."""
        if not self.fetched:
            return open_fn(self.paths[k])
        fetcher = self.fetcher
        # Pinned against eviction while open_fn runs; where a native LazyFiles is the fetcher's
        # reader (provide_to: a source whose collation threads map the files), nothing is pinned
        # here: a copy evicted between the two steps is fetched again (the loop), and a mapping
        # made stays valid after an eviction (an unlink).
        pins = self._opened_pins or _NO_PINS
        for _ in range(_OPEN_ATTEMPTS):  # a copy another process evicted between the two steps: again
            pins.pin(k, 1)
            try:
                fetcher.provide(k)
                try:
                    return open_fn(self.paths[k])
                except FileNotFoundError:
                    continue
            finally:
                pins.pin(k, -1)
        raise FileNotFoundError(f"{self.names[k]}: its cached copy kept disappearing (another process evicts it)")

    def provide_to(self, lazy_files: Any) -> None:
        """Makes the fetcher the provider of a native LazyFiles over self.paths: the collation
        threads map each file after the fetcher made it present."""
        self._make_fetcher(lazy_files)

    # ------------------------------------------------------------------ the plan (the Loader's side)
    def shards_read(self, units: Sequence[Sequence[int]] | None = None, unit_of_shard: Any = None,
                    shard_bytes: Any = None, per_sample: bool = False) -> None:
        """How the source's shards read the files: `units` the groups of files fetched together
        (default: each file alone; a dataset directory's shard: its columns' files), and the unit
        each of the source's shards reads with its share of the bytes (default: shard k is unit k;
        a Parquet row group reads its file, weighted by its compressed bytes). per_sample: sample
        i reads file i alone (an image folder), whatever the source's shards: the plan hands the
        fetcher its sample ids as they are."""
        self.unit_per_sample = per_sample
        self._units = None if units is None else [list(u) for u in units]
        self._unit_of_shard = None if unit_of_shard is None else np.asarray(unit_of_shard, dtype=np.int64)
        self._shard_bytes = None if shard_bytes is None else np.asarray(shard_bytes, dtype=np.int64)

    @property
    def fetcher(self) -> Any:
        return self._make_fetcher(None)

    def _make_fetcher(self, lazy_files: Any) -> Any:
        from .cache import Entry  # noqa: PLC0415
        from .fetcher import Fetcher  # noqa: PLC0415

        with self._lock:
            if self._fetcher is None:
                if not self.fetched:
                    raise ValueError("these files are local: nothing is fetched")
                entries = [Entry(u, rel, n, check, pin[2])
                           for u, rel, n, check, pin in zip(self.urls, self._rels, self.sizes, self._checks, self.pins)]
                units = self._units or [[k] for k in range(len(entries))]
                self._fetcher = Fetcher(self.client, self.cache, entries, units, self.limit)
                if lazy_files is None:
                    self._opened_pins = _Pins(len(entries))
                    lazy_files = self._opened_pins
                self._fetcher.bind(lazy_files)
            elif lazy_files is not None:
                self._fetcher.bind(lazy_files)
            return self._fetcher

    @property
    def shard_bytes(self) -> np.ndarray:
        """Bytes each of the source's shards reads (what the cache must hold for it)."""
        return self._shard_bytes if self._shard_bytes is not None else self.fetcher.shard_bytes

    def bound_pins(self, threads: int) -> None:
        self.fetcher.bound_pins(threads)

    def ready(self) -> None:
        self.fetcher.ready()

    def follow(self, plan: Any, position: Callable[[], int | None], boundary: int | None = None) -> None:
        """Prefetch and evict along a plan of the source's shards (plan.window(step): PlanWindow)."""
        if self._unit_of_shard is not None:
            plan = _UnitPlan(plan, self._unit_of_shard)
        self.fetcher.follow(plan, position, boundary)

    def start_epoch(self, seq: Any, position: Callable[[], int | None], boundary: int | None = None,
                    prefetch: bool = True) -> None:
        """A whole plan at once: the source's shard of each sample from here on, in order."""
        seq = np.asarray(seq, dtype=np.int64)
        if self._unit_of_shard is not None:
            seq = self._unit_of_shard[seq]
        self.fetcher.start_epoch(seq, position, boundary, prefetch)

    def stats(self, walk: bool = True) -> Any:
        """Bytes fetched, requests, cache hits and misses, time waited, bytes/s, cache use."""
        return self.fetcher.stats(walk)


class _UnitPlan:
    """A plan of the source's shards as the fetcher reads it: of the units they read."""

    def __init__(self, plan: Any, unit_of_shard: np.ndarray):
        self._plan, self._unit_of_shard = plan, unit_of_shard

    def window(self, at: int) -> Any:
        w = self._plan.window(at)
        return w._replace(shards=self._unit_of_shard[w.shards])
