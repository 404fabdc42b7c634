"""What the Loader tells a remote source: its plan. Two hooks, called by the Loader for any
source (they do nothing unless the source reads object storage): at construction, the check that
the cache holds the shards one step reads; at each epoch's start, this rank's remaining sample
order, which the fetcher prefetches along and evicts by."""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np


def _fetcher_of(source: Any) -> Any:
    get = getattr(source, "_remote_fetcher", None)
    return get() if callable(get) else None


def _shard_of_samples(fetcher: Any, source: Any, plan: np.ndarray) -> np.ndarray:
    rows = source.shard_rows
    ends = np.cumsum(np.asarray(rows if rows is not None else [len(source)], dtype=np.int64))
    return np.searchsorted(ends, plan, side="right")


def attach_loader(loader: Any) -> None:
    """At Loader construction: a cache_limit below the bytes of the shards one step of this rank
    reads (epoch 0's plan) is an error naming both, never a hang later."""
    source = loader._source
    fetcher = _fetcher_of(source)
    if fetcher is None:
        return
    try:
        plan = np.asarray(loader.plan(0), dtype=np.int64)
    except (TypeError, ValueError):  # a loader with steps= or a Mix: its plan is by steps
        return
    if not len(plan):
        return
    b = loader.batch_size
    shards = _shard_of_samples(fetcher, source, plan)
    k = len(fetcher.shard_bytes)
    pairs = np.unique((np.arange(len(plan), dtype=np.int64) // b) * k + shards)
    per_step = np.bincount(pairs // k, weights=fetcher.shard_bytes[pairs % k])
    step = int(np.argmax(per_step))
    need = int(per_step[step])
    if need > fetcher.limit:
        raise ValueError(f"cache_limit is {fetcher.limit} bytes, but one step reads {need} bytes of shards (step {step} "
                         f"of epoch 0 reads {int(np.count_nonzero(pairs // k == step))} shards): raise cache_limit, "
                         "or use order='block' (fewer shards per step)")


def epoch_started(loader: Any, epoch: int, run: Any, devices: int) -> None:
    """At each epoch's start: the rest of this rank's plan goes to the fetcher, with the count of
    batches handed out as the consumer's position."""
    fetcher = _fetcher_of(loader._source)
    if fetcher is None or devices != 1 or loader.config.stepped:
        return  # split() and step-based runs: fetched on demand only
    plan = np.asarray(loader.plan(epoch), dtype=np.int64)
    b = loader.batch_size
    full = loader._schedule.samplers(1)[0].num_batches(epoch)
    skipped = max(0, full - run.num_batches(0)) * b  # a resumed epoch: its first batches are done
    rest = plan[skipped:]
    owner = weakref.ref(loader)

    def position() -> int | None:
        """Samples of `rest` handed out; None once this epoch is no longer the loader's."""
        live = owner()
        if live is None or live._schedule.run is not run or run.superseded or live._engine is None:
            return None
        return run.handed(0) * b

    seq = _shard_of_samples(fetcher, loader._source, rest)
    # The next epoch's order too: prefetch crosses the epoch boundary (a little: see
    # Fetcher._prefetch_round), and eviction sees next uses beyond this epoch's end.
    upcoming = _shard_of_samples(fetcher, loader._source, np.asarray(loader.plan(epoch + 1), dtype=np.int64))
    fetcher.start_epoch(np.concatenate([seq, upcoming]), position, boundary=len(seq))
