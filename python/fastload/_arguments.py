"""Argument checks shared by the Loader and its sources: integers, and the limits every size must
stay within before it reaches C++ (against this machine's memory, from _machine). All arithmetic
is on exact Python ints."""
from __future__ import annotations

import operator
from typing import Any

from . import _C
from ._machine import INT64_MAX, memory_limit, read_memory_limit as _memory_limit  # noqa: F401 - re-exported

# The sampler refuses a global batch (batch_size x world_size x devices) above this (sampler.h).
MAX_GLOBAL_BATCH: int = _C.MAX_GLOBAL_BATCH
# More collation threads than this only contend; the native pool takes a C int.
MAX_THREADS = 4096
# Batches in flight per device; each is one slot in every output of the pipeline.
MAX_PREFETCH = 65536
MAX_STREAMS = 1024
MAX_SAMPLES = 2**62


def as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _fmt(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.3g} GiB)"


def check_loader_limits(*, batch_size: int, prefetch: int, num_threads: int, copy_streams: int, batch_bytes: int,
                        prefetch_origin: str = "") -> None:
    """Refuses values that would overflow a size in the core or cannot be held in memory; each
    error names the argument and its value (prefetch_origin says where a default prefetch came
    from). `batch_bytes`: one full batch, every part (fastload._C.BatchLayout.batch_bytes). Runs
    after check_batch_limits, before the engine is built."""
    if num_threads > MAX_THREADS:
        raise ValueError(f"num_threads must be at most {MAX_THREADS} (more threads only contend for "
                         f"memory bandwidth), got {num_threads}")
    if prefetch > MAX_PREFETCH:
        raise ValueError(f"prefetch must be at most {MAX_PREFETCH}, got {prefetch}")
    if copy_streams > MAX_STREAMS:
        raise ValueError(f"copy_streams must be at most {MAX_STREAMS}, got {copy_streams}")
    limit = memory_limit()
    one = batch_bytes
    if one > limit:
        raise MemoryError(f"a batch of batch_size={batch_size} takes {_fmt(one)}, more than this machine's memory "
                          f"({_fmt(limit)}); lower batch_size")
    in_use = _C.batches_in_use(prefetch)  # the window and the batch the loop holds (core/memory_bound.h)
    if one * in_use > limit:
        raise MemoryError(f"prefetch={prefetch}{prefetch_origin} keeps up to {in_use} batches of {_fmt(one)} "
                          f"in use, more than this machine's memory ({_fmt(limit)}); lower prefetch or batch_size")


def check_batch_limits(source: Any, *, batch_size: int, world_size: int, global_batch: int) -> None:
    """Sizes the sampler and the batch layout must be able to hold (before either is made);
    global_batch: batch_size x world_size, as LoaderConfig counts it (_config.global_batch_of)."""
    if world_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"world_size must be at most 2**40, got {world_size}")
    if batch_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"batch_size must be at most 2**40, got {batch_size}")
    if global_batch > MAX_GLOBAL_BATCH:
        raise ValueError(f"batch_size * world_size must be at most 2**40, got batch_size={batch_size} "
                         f"and world_size={world_size}")
    if len(source) > MAX_SAMPLES:
        raise ValueError(f"source has {len(source)} samples; fastload takes at most 2**62 (positions, padding "
                         f"and resume points must stay within int64)")
