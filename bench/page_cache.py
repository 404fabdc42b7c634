"""The page cache of one file, for the benchmarks that read from disk (bench_disk.py, bench_order.py)."""
from __future__ import annotations

import os
from pathlib import Path


def evict(path: Path) -> None:
    """Drops the file's pages from the page cache (written back first, so that none stays dirty)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
