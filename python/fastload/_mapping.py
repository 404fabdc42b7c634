"""Files mapped read-only without holding a descriptor (fastload._C.FileMapping), and the cheap
check that many mapped files are still the ones mapped (fastload._C.FileSet: one stat per file in
C++, one call).

Python's mmap.mmap and np.memmap keep a duplicate descriptor per mapping: 100,000 mapped shards
would need 100,000 descriptors. These mappings close theirs at once, so any number of shards
works under the usual `ulimit -n 1024`."""
from __future__ import annotations

import errno
import os
from typing import Any, Sequence

import numpy as np

from . import _C

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
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = f.read().strip()
        with open("/proc/self/maps") as f:
            used = sum(1 for _ in f)
    except OSError:
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
        from ._columns import column_state, file_backing  # noqa: PLC0415 - _columns imports _C only

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
