"""Shard-aware orders: order="block" over shard boundaries and partition="shards" (whole shards per
rank), against the brute-force reference in shard_reference.py, and the sampling contract for
every order x partition mode: coverage, disjoint ranks, equal batch counts, locality, resume."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl
from fastload import _C
from fastload._sources.arrays import _declare_shards

import shard_reference as R
from reference import reference_batches


def sampler(n, b, w, r, *, seed=0, shuffle=True, order="block", even="pad", drop_last=False, block=8,
            partition="samples", rows=(), window=2):
    return _C.Sampler(n, b, w, r, seed, shuffle, order, even, drop_last, block, partition, list(rows), window)


def random_rows(rng, shards, lo=0, hi=40):
    rows = rng.integers(lo, hi, size=shards).tolist()
    if sum(rows) == 0:
        rows[0] = 1
    return rows


def all_batches(s, epoch, start=0):
    return [s.batch_ids(epoch, start, k) for k in range(s.num_batches(epoch, start))]


# ------------------------------------------------------------------ against the reference

def test_reference_permutation_is_the_native_one():
    for n in (1, 2, 7, 100, 4097):
        for epoch in (0, 5):
            native = sampler(n, 1, 1, 0, seed=9, order="random").permutation(epoch, 0, n)
            assert np.array_equal(native, R.permutation(n, 9, R.mix64(epoch)))


@pytest.mark.parametrize("case", range(40))
def test_block_over_shards_matches_reference(case):
    rng = np.random.default_rng(case)
    rows = random_rows(rng, int(rng.integers(1, 30)))
    n, seed, epoch = sum(rows), int(rng.integers(0, 2**63)), int(rng.integers(0, 5))
    window, block = int(rng.integers(1, 5)), int(rng.integers(1, 60))
    native = sampler(n, 4, 1, 0, seed=seed, block=block, rows=rows, window=window).permutation(epoch, 0, n)
    assert np.array_equal(native, R.block_order(rows, seed, epoch, window, block))
    assert np.array_equal(np.sort(native), np.arange(n))  # a permutation


@pytest.mark.parametrize("case", range(40))
def test_shards_partition_matches_reference(case):
    rng = np.random.default_rng(1000 + case)
    w = int(rng.integers(1, 5))
    rows = random_rows(rng, int(rng.integers(w, 3 * w + 3)), lo=1)
    n, seed, epoch = sum(rows), int(rng.integers(0, 2**63)), int(rng.integers(0, 5))
    b = int(rng.integers(1, 20))
    shuffle = bool(rng.integers(0, 4))  # mostly shuffled
    order = ["random", "block"][int(rng.integers(0, 2))]
    even = ["pad", "drop", "mask"][int(rng.integers(0, 3))]
    drop_last = bool(rng.integers(0, 2))
    window, block = int(rng.integers(1, 4)), int(rng.integers(1, 30))
    for r in range(w):
        s = sampler(n, b, w, r, seed=seed, shuffle=shuffle, order=order, even=even, drop_last=drop_last,
                    block=block, partition="shards", rows=rows, window=window)
        ref = R.shard_batches(rows, w, r, b, shuffle, order, seed, epoch, even, drop_last, window, block)
        got = all_batches(s, epoch)
        assert len(got) == len(ref) == s.num_batches(epoch)
        for (ids, valid), (rids, rvalid) in zip(got, ref):
            assert np.array_equal(ids, rids) and np.array_equal(valid, rvalid)


# ------------------------------------------------------------------ the contract, every mode

MODES = [(shuffle, order, partition) for partition in ("samples", "shards")
         for shuffle, order in ((False, "random"), (True, "random"), (True, "block"))]


@pytest.mark.parametrize("shuffle,order,partition", MODES)
def test_every_mode_covers_every_sample_once_with_disjoint_ranks(shuffle, order, partition):
    rng = np.random.default_rng(hash((shuffle, order, partition)) % 2**32)
    for _ in range(120):
        w = int(rng.integers(1, 6))
        rows = random_rows(rng, int(rng.integers(w, 4 * w + 4)), lo=0, hi=50)
        if sum(r > 0 for r in rows) < w:
            rows = [r + 1 for r in rows]
        n, b = sum(rows), int(rng.integers(1, 33))
        even = ["pad", "drop", "mask"][int(rng.integers(0, 3))]
        drop_last = bool(rng.integers(0, 2))
        epoch, seed = int(rng.integers(0, 4)), int(rng.integers(0, 2**32))
        where = (n, rows, w, b, even, drop_last, epoch)
        per_rank = []
        for r in range(w):
            s = sampler(n, b, w, r, seed=seed, shuffle=shuffle, order=order, even=even, drop_last=drop_last,
                        block=16, partition=partition, rows=rows, window=2)
            batches = all_batches(s, epoch)
            assert np.array_equal(s.plan(epoch, 0), np.concatenate([i for i, _ in batches]) if batches else [])
            per_rank.append(batches)
        counts = {len(x) for x in per_rank}
        assert len(counts) == 1, where  # every rank has the same number of batches
        for k in range(counts.pop()):
            assert len({len(x[k][0]) for x in per_rank}) == 1, where  # and equal batch sizes
        valid_ids = np.concatenate([i[v] for x in per_rank for i, v in x] or [np.zeros(0, np.int64)])
        assert len(np.unique(valid_ids)) == len(valid_ids), where  # no sample twice (padding aside)
        if even != "drop" and not drop_last:
            assert np.array_equal(np.sort(valid_ids), np.arange(n)), where  # every sample once
        if partition == "shards":
            # Whole shards: a rank's ids, padding included, lie in its own shards only.
            owned = [set(np.concatenate([i for i, _ in x]).tolist()) if x else set() for x in per_rank]
            for r in range(w):
                for q in range(r):
                    assert not owned[r] & owned[q], where
            shard_of = np.repeat(np.arange(len(rows)), rows)
            shard_sets = [set(shard_of[list(o)].tolist()) for o in owned]
            for r in range(w):
                for q in range(r):
                    assert not shard_sets[r] & shard_sets[q], where
        else:
            perm = sampler(n, b, 1, 0, seed=seed, shuffle=shuffle, order=order, block=16, rows=rows,
                           window=2).permutation(epoch, 0, n)
            for r in range(w):
                ref = reference_batches(perm, b, w, r, even, drop_last)
                assert all(np.array_equal(i, ri) and np.array_equal(v, rv)
                           for (i, v), (ri, rv) in zip(per_rank[r], ref)) and len(ref) == len(per_rank[r]), where


def test_order_is_a_pure_function_of_the_configuration():
    rows = [100, 0, 37, 250, 80, 80, 3]
    a = sampler(550, 8, 2, 1, seed=4, rows=rows, partition="shards").plan(2, 0)
    b = sampler(550, 8, 2, 1, seed=4, rows=rows, partition="shards").plan(2, 0)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sampler(550, 8, 2, 1, seed=4, rows=rows, partition="shards").plan(3, 0))
    p = sampler(550, 8, 1, 0, seed=4, rows=rows).permutation(1, 0, 550)
    assert not np.array_equal(p, sampler(550, 8, 1, 0, seed=5, rows=rows).permutation(1, 0, 550))


def test_block_without_shards_is_unchanged():
    """No shard boundaries: order="block" keeps its 4096-sample blocks (same output as before)."""
    n = 20_000
    old = _C.Sampler(n, 4, 1, 0, 7, True, "block", "pad", False, 4096).permutation(1, 0, n)
    new = sampler(n, 4, 1, 0, seed=7, block=4096, rows=[], window=4).permutation(1, 0, n)
    assert np.array_equal(old, new)
    assert np.all(np.diff(np.sort(old[:4096] // 4096)) == 0)  # the first 4096 positions: one block


def test_random_order_ignores_shards():
    rows = [500, 500, 1000]
    a = sampler(2000, 4, 1, 0, seed=3, order="random", rows=rows).permutation(0, 0, 2000)
    assert np.array_equal(a, sampler(2000, 4, 1, 0, seed=3, order="random").permutation(0, 0, 2000))


def test_len_is_the_same_every_epoch_with_whole_shards():
    rows = [100, 90, 80, 70, 65, 10, 10, 3]
    for w in (1, 2, 3):
        for even in ("pad", "drop"):
            counts = {sampler(sum(rows), 16, w, 0, rows=rows, partition="shards", even=even).num_batches(e)
                      for e in range(8)}
            assert len(counts) == 1


def test_shards_balanced_by_rows_and_reassigned_every_epoch():
    rows = [1000] * 12 + [500]
    n = sum(rows)
    owners = []
    for epoch in range(4):
        plans = [sampler(n, 100, 3, r, rows=rows, partition="shards", even="drop").plan(epoch, 0) for r in range(3)]
        assert all(len(p) == 4000 for p in plans)  # min share: 4 shards of 1000 (+ the 500 is on one rank)
        owners.append(tuple(frozenset((np.unique(p // 1000)).tolist()) for p in plans))
    assert len(set(owners)) > 1  # shards move between ranks across epochs


# ------------------------------------------------------------------ locality

def test_block_windows_touch_at_most_window_shards():
    rng = np.random.default_rng(7)
    block, window = 64, 3
    rows = rng.integers(block, 4 * block, size=40).tolist()  # every shard >= block rows
    n = sum(rows)
    shard_of = np.repeat(np.arange(len(rows)), rows)
    for epoch in range(3):
        p = sampler(n, 8, 1, 0, seed=11, block=block, rows=rows, window=window).permutation(epoch, 0, n)
        sizes = [sum(r for _, r in g) for g in R.block_windows(rows, 11, epoch, window, block)]
        assert all(len(g) <= window for g in R.block_windows(rows, 11, epoch, window, block))
        lo = 0
        for size in sizes:  # positions of one window read at most `window` shards
            assert len(np.unique(shard_of[p[lo:lo + size]])) <= window
            lo += size
        # Any run of positions shorter than the smallest shard spans at most two windows.
        run = min(rows)
        for start in range(0, n - run, run // 2):
            assert len(np.unique(shard_of[p[start:start + run]])) <= 2 * window
        # ... while batches still mix shards, and random order reads everywhere.
        mixed = np.mean([len(np.unique(shard_of[p[i:i + 32]])) for i in range(0, n - 32, 32)])
        assert 1.5 < mixed < window + 0.5  # a batch across two windows may read more
        r = sampler(n, 8, 1, 0, seed=11, order="random", rows=rows).permutation(epoch, 0, n)
        assert np.mean([len(np.unique(shard_of[r[i:i + 32]])) for i in range(0, n - 32, 32)]) > 2 * window


def test_small_shards_are_grouped_up_to_the_block_size():
    rows = [5] * 100
    p = sampler(500, 8, 1, 0, seed=2, block=50, rows=rows, window=2).permutation(0, 0, 500)
    shard_of = np.repeat(np.arange(100), rows)
    for lo in range(0, 500, 50):  # windows of 10 shards (50 rows), not 2 shards (10 rows)
        assert len(np.unique(shard_of[p[lo:lo + 50]])) == 10


def test_rank_with_whole_shards_and_block_order_reads_few_shards_at_a_time():
    rows = [300] * 16
    shard_of = np.repeat(np.arange(16), rows)
    for r in range(2):
        ids = sampler(4800, 50, 2, r, seed=1, block=100, rows=rows, window=2, partition="shards").plan(0, 0)
        assert len(ids) == 2400
        for lo in range(0, 2400, 600):
            assert len(np.unique(shard_of[ids[lo:lo + 600]])) <= 2


# ------------------------------------------------------------------ Loader: arguments, resume

N = 3000
ROWS = [400, 350, 0, 500, 250, 600, 300, 600]


def source(rows=ROWS):
    return _declare_shards(fl.Dataset({"x": np.arange(sum(rows), dtype=np.int64)}), rows)


def loader(rank=0, world=1, **kw):
    kw.setdefault("batch_size", 32)
    kw.setdefault("shuffle", True)
    kw.setdefault("order", "block")
    kw.setdefault("seed", 3)
    return fl.Loader(kw.pop("src", None) or source(), rank=rank, world_size=world, num_threads=2, device="cpu",
                     with_index=True, **kw)


def ids(batches):
    return [b["index"].numpy().copy() for b in batches]


def test_shard_rows_property_defaults_to_none():
    assert fl.Dataset({"x": np.arange(4)}).shard_rows is None
    assert fl.Windows(np.arange(100, dtype=np.uint16), 10).shard_rows is None
    assert source().shard_rows == ROWS
    with pytest.raises(ValueError, match="add up to"):
        _declare_shards(fl.Dataset({"x": np.arange(4)}), [1, 2])


def test_partition_arguments_are_checked():
    with pytest.raises(ValueError, match="partition must be one of .*'rows'"):
        loader(partition="rows")
    with pytest.raises(ValueError, match="partition='shards' needs a source with shard boundaries"):
        fl.Loader(fl.Dataset({"x": np.arange(10)}), 2, partition="shards", rank=0, world_size=1, device="cpu")
    with pytest.raises(ValueError, match="at least world_size=8 non-empty shards, got 7"):
        loader(partition="shards", world=8)
    assert len(loader(partition="shards", world=7)) > 0


def test_split_with_whole_shards_needs_a_shard_per_device():
    two = loader(partition="shards", world=4, src=_declare_shards(fl.Dataset({"x": np.arange(40)}), [10] * 4))
    with pytest.raises(ValueError, match="at least world_size=8 non-empty shards, got 4"):
        two.split(["cpu", "cpu"])


@pytest.mark.parametrize("partition", ["samples", "shards"])
def test_loader_batches_follow_the_plan_and_stay_in_own_shards(partition):
    w = 3
    seen = []
    for r in range(w):
        ld = loader(r, w, partition=partition, even="mask")
        got = list(ld)
        plan = ld.plan(0)
        assert np.array_equal(np.concatenate([b["index"].numpy() for b in got]), plan)
        assert all(np.array_equal(b["x"].numpy(), b["index"].numpy()) for b in got)
        seen.append(np.concatenate([b["index"].numpy()[b["valid"].numpy()] for b in got]))
        assert len(got) == len(ld)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(N))
    if partition == "shards":
        shard_of = np.repeat(np.arange(len(ROWS)), ROWS)
        sets = [set(shard_of[s].tolist()) for s in seen]
        assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])


@pytest.mark.parametrize("partition,order", [("shards", "block"), ("shards", "random"), ("samples", "block")])
@pytest.mark.parametrize("k", [1, 5])
def test_resume_mid_epoch_at_the_same_world_size_is_exact(partition, order, k):
    w = 2
    full = [ids(loader(r, w, partition=partition, order=order)) for r in range(w)]
    runs = [loader(r, w, partition=partition, order=order, prefetch=3) for r in range(w)]
    its = [iter(x) for x in runs]
    for it in its:
        for _ in range(k):
            next(it)
    state = runs[0].state_dict()
    assert state["partition"] == partition and state["world_size"] == w
    for r in range(w):
        resumed = loader(r, w, partition=partition, order=order)
        resumed.load_state_dict(state)
        rest = ids(resumed)
        assert len(rest) == len(full[r]) - k
        assert all(np.array_equal(a, b) for a, b in zip(rest, full[r][k:]))


def test_whole_shards_resume_with_another_batch_size_continues_each_rank_where_it_stopped():
    w = 2
    runs = [loader(r, w, partition="shards", batch_size=40) for r in range(w)]
    its = [iter(x) for x in runs]
    for it in its:
        for _ in range(3):
            next(it)
    state = runs[0].state_dict()
    for r in range(w):
        plan = loader(r, w, partition="shards", batch_size=40).plan(0)
        resumed = loader(r, w, partition="shards", batch_size=16)
        resumed.load_state_dict(state)
        assert np.array_equal(np.concatenate(ids(resumed)), plan[120:])


def test_whole_shards_refuse_a_mid_epoch_resume_at_another_world_size():
    run = loader(0, 2, partition="shards")
    it = iter(run)
    next(it)
    state = run.state_dict()
    with pytest.raises(ValueError, match="partition='shards' resumes mid-epoch only at the same world size"):
        loader(0, 3, partition="shards").load_state_dict(state)
    # A multiple of the saved size could be reached with split(); refused when the epoch starts.
    one = loader(0, 1, partition="shards")
    one.load_state_dict(state)
    with pytest.raises(ValueError, match="world size 2 .*resuming at 1 is not supported"):
        iter(one)
    one.load_state_dict(state)
    assert len(one.split(["cpu", "cpu"])) == 2  # 1 rank x 2 devices = the saved world size
    # An epoch boundary is no mid-epoch resume: any world size may start the next epoch.
    for _ in it:
        pass
    end = run.state_dict()
    assert end["position"] == 0
    other = loader(0, 3, partition="shards")
    other.load_state_dict(end)
    assert len(ids(other)) == len(other)
    # And the partition itself must match.
    with pytest.raises(ValueError, match="partition='shards'; this loader has partition='samples'"):
        loader(0, 2).load_state_dict(state)


def test_block_order_over_shards_resumes_elastically():
    """Saved at 2 ranks x 24, resumed at 4 ranks x 12 (same global batch): the remaining full
    global steps hold the same samples."""
    w0, b0, w1, b1, k = 2, 24, 4, 12, 10
    g = w0 * b0
    full = [ids(loader(r, w0, batch_size=b0)) for r in range(w0)]
    steps0 = [np.sort(np.concatenate([full[r][s] for r in range(w0)])) for s in range(len(full[0]))]
    runs = [loader(r, w0, batch_size=b0) for r in range(w0)]
    for x in runs:
        it = iter(x)
        for _ in range(k):
            next(it)
        x._keep = it
    state = runs[0].state_dict()
    assert state["position"] == k * g
    rest = []
    for r in range(w1):
        resumed = loader(r, w1, batch_size=b1)
        resumed.load_state_dict(state)
        rest.append(ids(resumed))
    full_steps = (N - k * g) // g
    for s in range(full_steps):
        assert np.array_equal(np.sort(np.concatenate([rest[r][s] for r in range(w1)])), steps0[k + s])
    assert np.array_equal(np.sort(np.concatenate([np.concatenate(x) for x in rest] + [np.concatenate(
        [full[r][s] for s in range(k)]) for r in range(w0)])), np.arange(N))
