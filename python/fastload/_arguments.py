"""Argument checks shared by the Loader and its sources: integers, the limits every size must stay
within before it reaches C++, and this machine's memory. All arithmetic is on exact Python ints."""
from __future__ import annotations

import functools
import operator
import os
from typing import Any

# The sampler refuses a global batch (batch_size x world_size x devices) above this (sampler.cpp).
MAX_GLOBAL_BATCH = 2**40
# More collation threads than this only contend; the native pool takes a C int.
MAX_THREADS = 4096
# Batches in flight per device; each is one slot in every output of the pipeline.
MAX_PREFETCH = 65536
MAX_STREAMS = 1024
INT64_MAX = 2**63 - 1
MAX_SAMPLES = 2**62


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


@functools.lru_cache(maxsize=1)
def memory_limit() -> int:
    """Bytes this process can ever hold: physical memory, or a smaller cgroup limit."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        limit = 2**63 - 1
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < limit:
            limit = int(text)
    return limit


def _fmt(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.3g} GiB)"


def check_loader_limits(source: Any, *, batch_size: int, world_size: int, prefetch: int, num_threads: int,
                        streams: int, batch_bytes: int, prefetch_origin: str = "") -> None:
    """Refuses values that would overflow a size in the core or cannot be held in memory; each
    error names the argument and its value (prefetch_origin says where a default prefetch came
    from). `batch_bytes`: one full batch, every part (fastload._C.BatchLayout.batch_bytes). Runs
    before the engine is built."""
    if num_threads > MAX_THREADS:
        raise ValueError(f"num_threads must be at most {MAX_THREADS} (more threads only contend for "
                         f"memory bandwidth), got {num_threads}")
    if prefetch > MAX_PREFETCH:
        raise ValueError(f"prefetch must be at most {MAX_PREFETCH}, got {prefetch}")
    if streams > MAX_STREAMS:
        raise ValueError(f"streams must be at most {MAX_STREAMS}, got {streams}")
    check_batch_limits(source, batch_size=batch_size, world_size=world_size)
    limit = memory_limit()
    one = batch_bytes
    if one > limit:
        raise MemoryError(f"a batch of batch_size={batch_size} takes {_fmt(one)}, more than this machine's memory "
                          f"({_fmt(limit)}); lower batch_size")
    if one * (prefetch + 1) > limit:
        raise MemoryError(f"prefetch={prefetch}{prefetch_origin} keeps up to {prefetch + 1} batches of {_fmt(one)} "
                          f"in memory, more than this machine's memory ({_fmt(limit)}); lower prefetch or batch_size")


def check_batch_limits(source: Any, *, batch_size: int, world_size: int) -> None:
    """Sizes the sampler and the batch layout must be able to hold (before either is made)."""
    if world_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"world_size must be at most 2**40, got {world_size}")
    if batch_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"batch_size must be at most 2**40, got {batch_size}")
    if batch_size * world_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"batch_size * world_size must be at most 2**40, got batch_size={batch_size} "
                         f"and world_size={world_size}")
    if len(source) > MAX_SAMPLES:
        raise ValueError(f"source has {len(source)} samples; fastload takes at most 2**62 (positions, padding "
                         f"and resume points must stay within int64)")
