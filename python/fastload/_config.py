"""A Loader's configuration, resolved once: each argument checked once, and everything that follows
from them (rank and world size, the device, thread count, the rows a batch buffer holds, the batch
layout, the default prefetch, the memory bound) derived once into one immutable LoaderConfig that
the Loader, its schedule, `stats()`, `tune` and the engine read.

The batch layout and the memory bound are the native side's (fastload._C.BatchLayout and
fastload._C.batches_held / batches_in_use): asked for here, never recomputed.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from . import _C
from ._arguments import as_int, check_batch_limits, check_loader_limits
from ._environment import default_num_threads, resolve_device, resolve_rank
from ._machine import memory_limit
from ._sources.protocol import default_order, member

EVEN: tuple[str, ...] = tuple(_C.EVEN_POLICIES)
ORDER: tuple[str, ...] = tuple(_C.ORDERS)
PARTITION: tuple[str, ...] = tuple(_C.PARTITIONS)
WORKERS = ("threads", "processes")
MAX_SEED = 2**64 - 1
MAX_STEPS = 2**62
# prefetch=None: as many batches as fit in this budget, at most PREFETCH_MAX, and never fewer
# than keep every stage busy (see default_prefetch). Small batches come every few µs, and a deeper
# window lets the consumer take several per wake-up. Large ones want few: batches that fit in
# about half the last-level cache are written and reused there, and every batch beyond that
# costs a trip through DRAM (on the benchmark's 32 MiB L3, 150 KiB-row batches of 9.8 MB reach
# 0.88x of the copy ceiling with 2 in flight against 0.69x with 4; bench/RESULTS.md).
PREFETCH_BUDGET_BYTES = 16 << 20
PREFETCH_MIN = 2
PREFETCH_MAX = 32


def default_prefetch(batch_bytes: int, num_threads: int, copy_streams: int = 0) -> int:
    """Batches in flight per device when prefetch is not given: as many as fit in
    PREFETCH_BUDGET_BYTES (at most PREFETCH_MAX), but at least one per collation thread plus one per
    copy stream on a GPU (each thread builds a whole batch, and a batch being copied keeps its
    place), and at least PREFETCH_MIN. The per-thread floor stops at a quarter of the machine's
    memory: with huge batches, idle threads are better than a default that cannot be allocated.
    `batch_bytes`: one full batch over every part (fastload._C.BatchLayout.batch_bytes);
    `copy_streams`: the copy streams in use (0 on the CPU)."""
    batch = max(1, batch_bytes)
    fits = memory_limit() // (4 * batch)
    busy = max(PREFETCH_MIN, min(num_threads + copy_streams, fits))
    return max(busy, min(PREFETCH_MAX, PREFETCH_BUDGET_BYTES // batch))


@dataclass(frozen=True)
class Arguments:
    """The Loader's own arguments, each checked once, before the source is read."""

    batch_size: int
    seed: int
    shuffle: bool
    drop_last: bool
    with_index: bool
    order: str
    even: str
    steps: int | None
    prefetch_given: int | None
    copy_streams: int  # as given: per GPU (LoaderConfig.active_copy_streams is 0 on the CPU)
    num_threads: int
    threads_given: bool
    workers: str
    workers_given: bool
    timeout: float | None


def check_arguments(*, batch_size: Any, seed: Any = 0, shuffle: Any = False, drop_last: Any = False,
                    with_index: Any = False, order: Any = None, even: Any = "pad", steps: Any = None,
                    prefetch: Any = None, copy_streams: Any = 1, streams: Any = None, num_threads: Any = None,
                    num_workers: Any = None, workers: Any = None, timeout: Any = None) -> Arguments:
    """Checks each argument once (a ValueError or TypeError naming it and its value). `streams` is
    the old name of `copy_streams`: accepted with a FutureWarning. order=None: the source's own
    (decided in resolve(), from the source)."""
    batch_size = as_int("batch_size", batch_size)
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    seed = as_int("seed", seed)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    for name, flag in (("shuffle", shuffle), ("drop_last", drop_last), ("with_index", with_index)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if order is not None and order not in ORDER:
        raise ValueError(f"order must be one of {ORDER}, got {order!r}")
    if even not in EVEN:
        raise ValueError(f"even must be one of {EVEN}, got {even!r}")
    if steps is not None:
        steps = as_int("steps", steps)
        if not 0 < steps <= MAX_STEPS:
            raise ValueError(f"steps must be a positive number of batches (at most 2**62), got {steps}")
    if prefetch is not None:
        prefetch = as_int("prefetch", prefetch)
        if prefetch <= 0:
            raise ValueError(f"prefetch must be positive, got {prefetch}")
    copy_streams = _copy_streams(copy_streams, streams)
    if num_threads is not None and num_workers is not None:
        raise ValueError(f"num_threads and num_workers name the same thing (the threads or processes that build "
                         f"batches); give one, got num_threads={num_threads!r} and num_workers={num_workers!r}")
    threads_given = num_workers if num_threads is None else num_threads
    threads_name = "num_threads" if num_workers is None else "num_workers"
    threads = default_num_threads() if threads_given is None else as_int(threads_name, threads_given)
    if threads <= 0:
        raise ValueError(f"{threads_name} must be positive, got {threads}"
                         + (" (fastload has no main-process mode: 1 runs one worker thread)" if threads == 0 else ""))
    if workers is not None and workers not in WORKERS:
        raise ValueError(f"workers must be one of {WORKERS}, got {workers!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
    return Arguments(batch_size=batch_size, seed=seed, shuffle=bool(shuffle), drop_last=bool(drop_last),
                     with_index=bool(with_index), order=order, even=even, steps=steps, prefetch_given=prefetch,
                     copy_streams=copy_streams, num_threads=threads, threads_given=threads_given is not None,
                     workers=workers or "threads", workers_given=workers is not None, timeout=timeout)


def python_options(args: Arguments, python_source: Any) -> Arguments:
    """The arguments with a fastload.PythonSource's own workers= and timeout= where the Loader's
    are not given (the same option given twice, differently, is an error)."""
    if python_source is None:
        return args
    workers, timeout = args.workers, args.timeout
    if python_source.workers is not None:
        if args.workers_given and args.workers != python_source.workers:
            raise ValueError(f"workers is given twice: workers={args.workers!r} to the Loader and "
                             f"workers={python_source.workers!r} to its PythonSource; give it once")
        workers = python_source.workers
    if python_source.timeout is not None:
        if args.timeout is not None and args.timeout != python_source.timeout:
            raise ValueError(f"timeout is given twice: timeout={args.timeout!r} to the Loader and "
                             f"timeout={python_source.timeout!r} to its PythonSource; give it once")
        timeout = python_source.timeout
    return replace(args, workers=workers, timeout=timeout)


def _copy_streams(copy_streams: Any, streams: Any) -> int:
    """copy_streams, or its old name streams= (deprecated, with a FutureWarning)."""
    name = "copy_streams"
    if streams is not None:
        if not (copy_streams == 1 and type(copy_streams) is int):
            raise ValueError(f"streams is the old name of copy_streams; give copy_streams only, got "
                             f"copy_streams={copy_streams!r} and streams={streams!r}")
        warnings.warn("fastload.Loader(streams=) is renamed copy_streams=; streams= will be removed",
                      FutureWarning, stacklevel=4)
        copy_streams, name = streams, "streams"
    value = as_int(name, copy_streams)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def global_batch_of(batch_size: int, replicas: int) -> int:
    """Samples per global step: batch_size on each of `replicas` data-parallel consumers. The one
    formula: LoaderConfig.global_batch, the limit check and the resume state all take it from here."""
    return batch_size * replicas


@dataclass(frozen=True)
class LoaderConfig(Arguments):
    """Everything a Loader is configured with, resolved once at construction (see the module).

    - rank, world_size: this process's, resolved from the arguments or the environment.
    - device: "cpu" or "cuda:N" (always with its index).
    - stepped: step-based sampling (steps= or a Mix): every step full, one stream over the sources.
    - max_rows: the rows a batch buffer holds: batch_size, or len(source) when that is smaller
      (an epoch's padding never makes a rank's batch exceed the dataset); batch_size when stepped.
    - native: the native source the engine reads (fastload._C.BatchSource), made once.
    - layout: the native batch layout (fastload._C.BatchLayout) for max_rows rows.
    - prefetch: as given, else default_prefetch for this layout, threads and copy streams.
    """

    rank: int
    world_size: int
    partition: str
    device: torch.device
    stepped: bool
    with_source: bool
    max_rows: int
    native: Any
    layout: Any
    prefetch: int

    def replicas(self, devices: int = 1) -> int:
        """Data-parallel consumers over `devices` devices per rank: world_size x devices."""
        return self.world_size * devices

    def global_batch(self, devices: int = 1) -> int:
        """Samples per global step over `devices` devices per rank."""
        return global_batch_of(self.batch_size, self.replicas(devices))

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def active_copy_streams(self) -> int:
        """Copy streams in use: copy_streams on a GPU, none on the CPU."""
        return self.copy_streams if self.gpu else 0

    @property
    def batch_bytes(self) -> int:
        """One full batch over every part, as the native layout counts it."""
        return int(self.layout.batch_bytes(self.max_rows))

    @property
    def memory_bound(self) -> int:
        """The most batch memory the loader holds per device for a loop that drops each batch
        (host memory on the CPU, device memory per GPU): fastload._C.batches_held batches."""
        return self.batch_bytes * _C.batches_held(self.prefetch)

    @property
    def names(self) -> list[str]:
        return list(self.layout.names)


def resolve(args: Arguments, source: Any, *, rank: Any = None, world_size: Any = None, process_group: Any = None,
            partition: Any = "samples", device: Any = None, stepped: bool = False,
            with_source: bool = False) -> LoaderConfig:
    """The configuration of a Loader over `source` (already a fastload source): what follows from
    `args` and the source, checked (the errors name the argument). order=None becomes the
    source's default order (_sources.protocol.default_order)."""
    if args.order is None:
        args = replace(args, order=default_order(source))
    rank, world_size = resolve_rank(rank, world_size, process_group)
    if partition not in PARTITION:
        raise ValueError(f"partition must be one of {PARTITION}, got {partition!r}")
    if partition == "shards":
        if source.shard_rows is None:
            raise ValueError("partition='shards' needs a source with shard boundaries (shard_rows); "
                             f"{source!r} has none")
        shards = sum(1 for r in source.shard_rows if r > 0)
        if shards < world_size:
            raise ValueError(f"partition='shards' needs at least world_size={world_size} non-empty "
                             f"shards, got {shards}")
    if stepped:
        _check_stepped(args.even, partition)
    resolved_device = resolve_device(device)
    check_batch_limits(source, batch_size=args.batch_size, world_size=world_size,
                       global_batch=global_batch_of(args.batch_size, world_size))
    # A stream's steps are always full: a source that runs out starts its next epoch within the batch.
    # fl.Pack: an epoch's packed rows are not len(source) (its documents); and with_index adds its
    # "documents" part to the native source.
    packs = member(source, "packs_rows")
    max_rows = args.batch_size if stepped or packs else min(args.batch_size, len(source))
    native = source.native_source(with_documents=True) if packs and args.with_index else source.native_source()
    layout = _C.BatchLayout(native, max_rows, args.with_index, args.even == "mask", with_source)
    batch_bytes = layout.batch_bytes(max_rows)
    prefetch, origin = args.prefetch_given, ""
    if prefetch is None:
        copy_streams = args.copy_streams if resolved_device.type == "cuda" else 0
        prefetch = default_prefetch(batch_bytes, args.num_threads, copy_streams)
        origin = f" (the default: at least one batch per thread, num_threads={args.num_threads})"
    check_loader_limits(batch_size=args.batch_size, prefetch=prefetch, num_threads=args.num_threads,
                        copy_streams=args.copy_streams, batch_bytes=batch_bytes, prefetch_origin=origin)
    given = {f.name: getattr(args, f.name) for f in fields(Arguments)}
    return LoaderConfig(**given, rank=rank, world_size=world_size, partition=partition, device=resolved_device,
                        stepped=stepped, with_source=with_source, max_rows=max_rows, native=native, layout=layout,
                        prefetch=prefetch)


def default_config(source: Any, batch_size: int, device: Any = None) -> LoaderConfig:
    """What fl.Loader(source, batch_size, device=device) resolves with every other argument at its
    default (tune compares its grid with these)."""
    return resolve(check_arguments(batch_size=batch_size), source, device=device)


def _check_stepped(even: str, partition: str) -> None:
    what = "steps= or a Mix (step-based sampling)"
    if even == "mask":
        raise ValueError(f"even='mask' has nothing to mask with {what}: every step is full, a source that runs "
                         "out starts its next epoch within the batch; use even='pad' (the default)")
    if partition == "shards":
        raise ValueError(f"partition='shards' is not available with {what}: a stream deals every step's samples "
                         "to all ranks; use partition='samples'")

