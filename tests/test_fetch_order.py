"""The order a fetcher is handed is the order the engine reads: in every run mode, the files (shards)
the Loader hands a source's stored_files() (the Source protocol member), step by step, are the
shards of the batches the Loader then delivers, a brute-force reference built from the batches'
own sample ids. This is the contract the look-ahead keeps whichever side computes it (see
docs/architecture.md, "Who reads the plan ahead"): a window that names other shards than the
batches read would prefetch files nobody reads and evict files a batch still needs."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl


class _NoCounters:
    def since(self, before: object) -> "_NoCounters":
        return self

    def plus(self, other: object) -> "_NoCounters":
        return self


class RecordingFiles:
    """Stands where a FileSet stands for the Loader (stored_files()): records each run's plan."""

    limit = 1 << 62

    def __init__(self, shards: int):
        self.shard_bytes = np.ones(shards, dtype=np.int64)
        self.plans: list[tuple[object, int | None]] = []

    def bound_pins(self, threads: int) -> None:
        pass

    def ready(self) -> None:
        pass

    def follow(self, plan: object, position: object, boundary: int | None = None) -> None:
        self.plans.append((plan, boundary))

    def stats(self, walk: bool = True) -> _NoCounters:
        return _NoCounters()


class Followed:
    """A source (an in-memory dataset with shards) whose files follow the run's order."""

    def __init__(self, inner: fl.Dataset):
        self.inner = inner
        self.files = RecordingFiles(len(inner.shard_rows))

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def names(self) -> list[str]:
        return self.inner.names

    @property
    def shard_rows(self) -> list[int]:
        return self.inner.shard_rows

    def native_source(self) -> object:
        return self.inner.native_source()

    def stored_files(self) -> RecordingFiles:
        return self.files


def sharded(rows: list[int], base: int = 0) -> Followed:
    """A source of sum(rows) samples in shards of `rows`, x[i] = base + i."""
    x = np.arange(base, base + sum(rows), dtype=np.int64)
    cuts = np.cumsum(rows)[:-1]
    return Followed(fl.Dataset({"x": list(np.split(x, cuts))}))


def planned(files: RecordingFiles, run: int = -1) -> tuple[list[np.ndarray], int | None]:
    """The shards of each step of a run's plan, read window by window as the fetcher reads it."""
    plan, boundary = files.plans[run]
    by_step: dict[int, list[np.ndarray]] = {}
    at = 0
    while True:
        w = plan.window(at)
        for step in np.unique(w.steps):
            by_step.setdefault(int(step), []).append(w.shards[w.steps == step])
        if w.last:
            break
        assert w.end > at, "a window that does not advance"
        at = w.end
    steps = max(by_step) + 1 if by_step else 0
    return [np.concatenate(by_step.get(k, [np.empty(0, np.int64)])) for k in range(steps)], boundary


def shards_of(source: Followed, ids: np.ndarray) -> np.ndarray:
    ends = np.cumsum(source.shard_rows)
    return np.searchsorted(ends, ids, side="right")


def read(loader: fl.Loader, source: Followed, limit: int | None = None) -> list[np.ndarray]:
    """The shards each delivered batch read (from its x values: the sample ids), in order."""
    out = []
    for k, b in enumerate(loader):
        if limit is not None and k == limit:
            break
        out.append(shards_of(source, b["x"].numpy()))
    return out


def assert_same(plan: list[np.ndarray], delivered: list[np.ndarray]) -> None:
    assert len(plan) >= len(delivered)
    for k, (p, d) in enumerate(zip(plan, delivered)):
        np.testing.assert_array_equal(p, d, err_msg=f"step {k}")


ROWS = [7, 3, 12, 1, 9, 5, 8, 11, 2, 6]


@pytest.mark.parametrize("order", ["random", "block", "sequential"])
@pytest.mark.parametrize("partition", ["samples", "shards"])
@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)])
def test_the_epochs_plan_is_the_shards_the_batches_read(order, partition, rank, world):
    src = sharded(ROWS)
    kw = dict(shuffle=order != "sequential", seed=5, rank=rank, world_size=world, partition=partition,
              num_threads=2)
    if order != "sequential":
        kw["order"] = order
    loader = fl.Loader(src, 4, **kw)
    first = read(loader, src)
    plan, boundary = planned(src.files)
    assert boundary == len(first)  # the run's steps, then the next epoch's
    assert_same(plan[:boundary], first)
    second = read(loader, src)  # the next epoch: the plan's steps past the boundary
    assert_same(plan[boundary:], second)
    plan2, _ = planned(src.files)
    assert_same(plan2, second)


def test_a_resume_mid_epoch_plans_the_rest_of_the_epoch():
    src = sharded(ROWS)
    kw = dict(shuffle=True, seed=3, order="block", num_threads=2)
    whole = read(fl.Loader(src, 4, **kw), src)
    loader = fl.Loader(src, 4, **kw)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = fl.Loader(src, 4, **kw)
    resumed.load_state_dict(state)
    rest = read(resumed, src)
    assert_same(rest, whole[5:])
    plan, boundary = planned(src.files)
    assert boundary == len(rest)
    assert_same(plan[:boundary], rest)


@pytest.mark.parametrize("order", ["random", "block"])
def test_steps_plan_the_steps_the_batches_read(order):
    src = sharded(ROWS)
    loader = fl.Loader(src, 4, steps=40, shuffle=True, seed=9, order=order, num_threads=2)  # several epochs
    got = read(loader, src)
    plan, boundary = planned(src.files)
    assert len(got) == 40 and boundary == 40
    assert_same(plan, got)


def test_a_mix_plans_each_sources_own_samples():
    parts = [sharded([5, 9, 4, 2], 0), sharded([3, 3, 8], 1000), sharded([11, 6], 2000)]
    mix = fl.Mix({"a": parts[0], "b": parts[1], "c": parts[2]}, {"a": 3, "b": 1, "c": 2})
    loader = fl.Loader(mix, 6, steps=25, shuffle=True, seed=4, num_threads=2)
    batches = [b["x"].numpy() for b in loader]
    for j, part in enumerate(parts):
        mine = [x[(x >= 1000 * j) & (x < 1000 * (j + 1))] - 1000 * j for x in batches]
        plan, _ = planned(part.files)
        assert_same(plan, [shards_of(part, ids) for ids in mine])
