"""What the Loader tells the remote sources it reads: its plan. Two hooks, called by the Loader
with its schedule's RunOrder (_schedules.py) for any source (they do nothing unless a source
reads object storage): at construction, the check that the cache holds the shards one step
reads; at each run's start (iter() or split(), epochs, steps= or a Mix), the run's order, which
each remote source's fetcher prefetches along and evicts by. A Mix's parts each follow their own
samples of the order; every run mode is the same order of steps to the fetcher."""
from __future__ import annotations

from typing import Any

import numpy as np

from .cache import cache_too_small
from .fetcher import PlanWindow

_HORIZON = 1 << 20  # samples of the order (all sources) per window a fetcher holds
_FIRST_STEPS = 4  # steps of a run's first window (then windows of _HORIZON samples)


def _fetcher_of(source: Any) -> Any:
    """The source's FileSet that follows the run's order (Source.stored_files()), or None."""
    get = getattr(source, "stored_files", None)
    return get() if callable(get) else None


def _shard_ends(source: Any) -> np.ndarray:
    rows = source.shard_rows
    return np.cumsum(np.asarray(rows if rows is not None else [len(source)], dtype=np.int64))


class _SourcePlan:
    """One source's share of a RunOrder, a window at a time (the fetcher's Plan)."""

    def __init__(self, order: Any, part: int):
        self.order, self.part = order, part
        source = order.sources[part]
        self.lo = order.offsets[part]
        self.hi = self.lo + len(source)
        self.ends = _shard_ends(source)
        self.per_sample = bool(getattr(_fetcher_of(source), "unit_per_sample", False))  # sample i: unit i
        self.only = len(order.sources) == 1
        self.steps_per_window = 0

    def window(self, at: int) -> PlanWindow:
        order = self.order
        short = not self.steps_per_window
        # A run's first window is a few steps, so that their downloads start at once.
        ids, counts = order.ids(at, at + (_FIRST_STEPS if short else self.steps_per_window))
        if short and len(counts):
            self.steps_per_window = max(1, _HORIZON // max(1, int(counts.max())))
        end = at + len(counts)
        steps = np.repeat(np.arange(at, end, dtype=np.int64), counts)
        if not self.only:
            mine = (ids >= self.lo) & (ids < self.hi)
            ids, steps = ids[mine] - self.lo, steps[mine]
        shards = ids if self.per_sample else np.searchsorted(self.ends, ids, side="right")
        return PlanWindow(shards, steps, end, end >= order.steps, short)


class RunStorage:
    """The storage counters of one run (Loader.stats()): each remote source's since the run began,
    added together; None when the loader reads no remote source."""

    def __init__(self, sources: tuple[Any, ...]):
        self.fetchers = [f for f in map(_fetcher_of, sources) if f is not None]
        self.begin()

    def begin(self) -> None:
        """A run starts (before its threads do): its counters start from here."""
        self.before = [f.stats(walk=False) for f in self.fetchers]

    def stats(self) -> Any:
        total = None
        for f, before in zip(self.fetchers, self.before):
            now = f.stats(walk=False).since(before)  # stats() may be called every few batches: no disk walk
            total = now if total is None else total.plus(now)
        return total


def attach_loader(order: Any, kind: str | None = None, threads: int = 1) -> RunStorage:
    """At Loader construction, with the order of its first run: a cache_limit that cannot hold
    what this rank's steps read together (in the first window of the plan, ~1M samples) is an
    error naming both sizes, never a hang later; each remote source's collation threads are bound
    to pins that fit the cache together (LazyFiles.pin_bound), and its fetcher readies its
    threads. Returns the storage counters from now on."""
    for part, source in enumerate(order.sources):
        fetcher = _fetcher_of(source)
        if fetcher is None:
            continue
        _check_room(fetcher, order, part, kind)
        fetcher.bound_pins(threads)
        fetcher.ready()
    return RunStorage(order.sources)


def _check_room(fetcher: Any, order: Any, part: int, kind: str | None) -> None:
    """The least cache a run reads without fetching a shard again within a step: the shards of the
    largest run of a step's rows that shares no shard with the rest of the step. Under
    order="block" a batch that straddles two windows is two such runs (the collation threads copy
    it in runs whose files fit the cache: LazyFiles.pin_bound), so a cache holding a window's
    shards is enough; under order="random" a step is one run of all its shards."""
    plan = _SourcePlan(order, part)
    plan.window(0)  # the short first window sizes the full ones
    w = plan.window(0)
    if not len(w.shards):
        return
    sizes = fetcher.shard_bytes
    k = len(sizes)
    pairs = _sorted_unique(w.steps * k + w.shards)  # (step, shard) read
    pair_steps = pairs // k
    first = np.concatenate([[True], pair_steps[1:] != pair_steps[:-1]])
    steps, at = pair_steps[first], np.cumsum(first) - 1  # each pair's step, as an index into steps
    per_step = np.bincount(at, weights=sizes[pairs % k])
    bounds = np.searchsorted(w.steps, steps), np.searchsorted(w.steps, steps, side="right")
    for worst in np.argsort(-per_step, kind="stable"):
        if per_step[worst] <= fetcher.limit:
            break
        rows = w.shards[bounds[0][worst]:bounds[1][worst]]
        need, shards = max(((int(sizes[run].sum()), len(run)) for run in _separate_runs(rows)), key=lambda r: r[0])
        if need > fetcher.limit:
            # Under order="block" a step's runs are the shards of one window each, so that is the least a
            # cache can hold: no other order reads fewer.
            way_out = ("" if kind == "block" else
                       ", or use order='block' (a step then reads the shards of one window at a time)")
            raise cache_too_small(fetcher.limit, need, f"but one step reads {need} bytes of shards (step "
                                  f"{int(steps[worst])} reads {shards} shards together)", way_out)


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """np.unique of int64 keys by a sort and a mask: numpy 2's np.unique hashes, 10x slower on the
    ~1M keys of a plan's window (0.4 s against 0.04 s, at every Loader construction)."""
    keys = np.sort(keys)
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys


def _separate_runs(rows: np.ndarray) -> list[np.ndarray]:
    """The shards of each run of a step's rows (the shard each row reads, in order) that shares no
    shard with the rows outside it: a cut after row i where no shard read up to i is read after."""
    shards, inverse = np.unique(rows, return_inverse=True)
    last = np.zeros(len(shards), dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(len(rows)))
    cuts = np.flatnonzero(np.maximum.accumulate(last[inverse]) == np.arange(len(rows))) + 1
    return [np.unique(rows[a:b]) for a, b in zip(np.concatenate([[0], cuts[:-1]]), cuts)]


def follow_run(order: Any) -> None:
    """At each run's start: every remote source's fetcher follows its samples of the run's order
    (prefetch along it, eviction by it), with the steps handed out as the consumer's position."""
    for part, source in enumerate(order.sources):
        fetcher = _fetcher_of(source)
        if fetcher is not None:
            fetcher.follow(_SourcePlan(order, part), order.position, boundary=order.boundary)
