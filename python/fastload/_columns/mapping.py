"""Files mapped read-only without holding a descriptor (fastload._C.FileMapping), and the cheap
check that many mapped files are still the ones mapped (fastload._C.FileSet: one stat per file in
C++, one call).

Python's mmap.mmap and np.memmap keep a duplicate descriptor per mapping: 100,000 mapped shards
would need 100,000 descriptors. These mappings close theirs at once, so any number of shards
works under the usual `ulimit -n 1024`.

Each mapped file is still one memory mapping, and Linux allows a process vm.max_map_count of them
(65,530 by default). A source of more files than the mapping budget (a quarter of what that limit
leaves free when fastload first needs it) is mapped lazily instead: its files are stat'ed, and the
collation threads map each when a batch touches it, through one cache per process that keeps at
most the budget of mappings live (fastload._C.MappingCache, csrc/core/lazy_mappings.h)."""
from __future__ import annotations

import contextlib
import errno
import os
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from .. import _C

FileMapping = _C.FileMapping


def map_file(path: str) -> Any:
    """The whole file at `path`, mapped read-only (OSError naming the file if it cannot be; the
    one for running out of mappings says which limit and what to do)."""
    try:
        return FileMapping(os.path.abspath(path))
    except OSError as e:
        if e.errno == errno.ENOMEM:
            raise OSError(errno.ENOMEM, f"{e.strerror}: {mapping_limit_hint()}", path) from None
        raise


def mapping_limit_hint() -> str:
    """Why mmap said ENOMEM with memory to spare: each mapped file is one memory mapping, and
    Linux allows a process vm.max_map_count of them (65,530 by default)."""
    limit, used = _max_map_count(), _mappings_in_use()
    if limit is None or used is None:
        return "the process may have reached its limit of memory mappings (vm.max_map_count)"
    return (f"this process holds {used} memory mappings and the system allows {limit} (vm.max_map_count); "
            "every shard file is one mapping: write fewer, larger shards, or raise the limit "
            "(sysctl -w vm.max_map_count=262144)")


def array_of(mapping: Any, dtype: np.dtype, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array over the mapped bytes [offset, offset + its size): it keeps the mapping
    alive, and the mapping is unmapped when the last such array dies."""
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(mapping, dtype=dtype, count=count, offset=offset).reshape(shape)


IDENTITY_FIELDS = ("device", "inode", "mtime_ns", "size")


class FileChecks:
    """The identity (st_dev, st_ino, st_mtime_ns, st_size) each of many files had when it was
    mapped, and a check that they still have it: one stat per file, without the GIL and without
    Python per file (19,000 files: a few ms)."""

    def __init__(self, paths: Sequence[str], identities: Sequence[Sequence[int]]):
        self.paths = list(paths)
        self._set = _C.FileSet(self.paths)
        self.expected = np.asarray(identities, dtype=np.int64).reshape(len(self.paths), 4)

    def changed(self) -> list[tuple[int, np.ndarray]]:
        """(index, identity now) of every file that changed; a file that cannot be stat'ed has
        identity (-1, errno, 0, -1)."""
        now = self._set.stat()
        bad = np.flatnonzero((now != self.expected).any(axis=1))
        return [(int(i), now[i]) for i in bad]


def describe_change(expected: Sequence[int], now: Sequence[int]) -> str:
    """What happened to a file, from its identities then and now."""
    if now[0] == -1:
        err = int(now[1])
        if err == errno.ENOENT:
            return "is missing (deleted or renamed since it was opened)"
        if err == errno.EINVAL:
            return "is no longer a regular file"
        return f"cannot be stat'ed ({os.strerror(err)})"
    if (now[0], now[1]) != (expected[0], expected[1]):
        return "was replaced by another file (a new inode) since it was opened"
    if now[3] < expected[3]:
        return (f"is {int(now[3])} bytes, but it was {int(expected[3])} when it was mapped: truncated (reading "
                f"it would kill the process with SIGBUS)")
    if now[3] > expected[3]:
        return f"is {int(now[3])} bytes, but it was {int(expected[3])} when it was mapped: it was written to"
    return "was modified (same inode and size, another mtime) since it was opened"


class TruncationCheck:
    """For arrays over FileMappings that fastload made itself (Windows.from_files): the one thing
    that can go wrong is a mapped file truncated in place (reading past its end is SIGBUS); a file
    replaced by another keeps the mapped one alive, and one that grew is harmless. Checked with one
    batched stat, and reported by the per-array check (which names the file and the byte)."""

    def __init__(self, labelled: Sequence[tuple[str, np.ndarray]], what: str):
        from .spec import column_state, file_backing  # noqa: PLC0415 - columns imports _C only

        self._labelled, self._what = list(labelled), what
        self._rows = []  # (index into labelled, mapping)
        for i, (_, a) in enumerate(self._labelled):
            b = file_backing(a)
            if b is not None:
                self._rows.append((i, b.mapping))
        self._checks = FileChecks([m.path for _, m in self._rows], [m.identity for _, m in self._rows])
        self._column_state = column_state

    def check(self) -> None:
        now = self._checks._set.stat()
        exp = self._checks.expected
        same = (now[:, 0] == exp[:, 0]) & (now[:, 1] == exp[:, 1])
        for j in np.flatnonzero(same & (now[:, 3] < exp[:, 3])):
            label, a = self._labelled[self._rows[int(j)][0]]
            self._column_state(label, a, self._what)  # raises ValueError naming the file


# ---------------------------------------------------------------------------- lazily mapped files
_MIN_BUDGET = 64
_cache_lock = threading.Lock()
_cache: tuple[int, Any] | None = None  # (pid, MappingCache): a forked child makes its own


def _max_map_count() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _mappings_in_use() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def default_budget() -> int:
    """A quarter of the mappings vm.max_map_count leaves free now (at least 64): the rest stays
    for mappings fastload maps eagerly, the allocator, torch and the user. Without the limit
    (not Linux): no budget, nothing is mapped lazily."""
    limit, used = _max_map_count(), _mappings_in_use()
    if limit is None or used is None:
        return 1 << 40
    return max(_MIN_BUDGET, (limit - used) // 4)


def mapping_cache() -> Any:
    """The process's cache of lazy mappings (fastload._C.MappingCache), its budget read once."""
    global _cache
    with _cache_lock:
        if _cache is None or _cache[0] != os.getpid():
            _cache = (os.getpid(), _C.MappingCache(default_budget()))
        return _cache[1]


@contextlib.contextmanager
def mapping_budget(budget: int) -> Iterator[Any]:
    """Tests: sources whose shards are first described inside map lazily past `budget` files,
    through a fresh cache of that budget (yielded: its stats() are the counters)."""
    global _cache
    cache = _C.MappingCache(budget)
    with _cache_lock:
        old, _cache = _cache, (os.getpid(), cache)
    try:
        yield cache
    finally:
        with _cache_lock:
            _cache = old


def maps_lazily(files: int) -> bool:
    """Whether a source of this many files should be mapped lazily: more files than the budget,
    or more than the mappings left free now (other sources mapped eagerly meanwhile) less room for
    the cache's budget (at most a quarter of the limit)."""
    budget = mapping_cache().budget
    if files > budget:
        return True
    if files <= 1024:  # far below any limit: no need to read /proc/self/maps
        return False
    limit, used = _max_map_count(), _mappings_in_use()
    return limit is not None and used is not None and files > limit - used - min(budget, limit // 4)


class LazyTable:
    """Files for the collation threads to map on demand (fastload._C.LazyFiles): per file its path,
    where its data lie (offset, bytes) and its identity (st_dev, st_ino, st_mtime_ns, st_size)
    recorded at open, which each mapping checks (a file replaced or changed since is an error naming
    it). Built once per source, so mappings outlive Loaders and epochs until evicted."""

    def __init__(self, paths: Sequence[str], offsets: Sequence[int], sizes: Sequence[int],
                 identities: Sequence[Sequence[int]]):
        n = len(paths)
        table = np.empty((n, 6), dtype=np.int64)
        table[:, 0] = np.asarray(offsets, dtype=np.int64).reshape(n)
        table[:, 1] = np.asarray(sizes, dtype=np.int64).reshape(n)
        table[:, 2:] = np.asarray(identities, dtype=np.int64).reshape(n, 4)
        self.paths = [os.fspath(p) for p in paths]
        self._table = table
        self._files = _C.LazyFiles(mapping_cache(), self.paths, table)
        self._pid = os.getpid()
        self.identities = table[:, 2:].copy()
        self.checks = FileChecks(self.paths, self.identities)

    @property
    def files(self) -> Any:
        """The native LazyFiles; a forked child gets its own (the parent's cache lock may be held by
        a thread that did not survive the fork), through the child's cache."""
        if self._pid != os.getpid():
            self._files = _C.LazyFiles(mapping_cache(), self.paths, self._table)
            self._pid = os.getpid()
        return self._files

    def __len__(self) -> int:
        return len(self.paths)

    def spec(self, file_ids: Sequence[int], offsets_ids: Sequence[int] = (), longest: int = -1) -> tuple:
        """The `lazy` field of a ColumnSpec whose shard k is file file_ids[k]."""
        return (self.files, np.asarray(file_ids, dtype=np.int32), np.asarray(offsets_ids, dtype=np.int32), longest)
