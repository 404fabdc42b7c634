"""The native sampler against the contract: permutation properties, rank partition, padding,
resume positions, and the O(1)-memory promise for a billion samples."""
from __future__ import annotations

import time

import numpy as np
import pytest

import fastload as fl
from fastload import _C

from reference import reference_batches


def sampler(n, b=4, w=1, r=0, seed=0, shuffle=True, order="random", even="pad", drop_last=False, block=4096):
    return _C.Sampler(n, b, w, r, seed, shuffle, order, even, drop_last, block)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9, 16, 17, 100, 1000, 4096, 4097, 65537, 100_003])
@pytest.mark.parametrize("order", ["random", "block"])
def test_permutation_is_a_bijection(n, order):
    p = sampler(n, order=order, block=64).permutation(0, 0, n)
    assert np.array_equal(np.sort(p), np.arange(n))


def test_shuffle_off_is_identity():
    assert np.array_equal(sampler(1000, shuffle=False).permutation(3, 0, 1000), np.arange(1000))


def test_permutation_windows_match_whole():
    s = sampler(10_007, seed=5)
    whole = s.permutation(2, 0, 10_007)
    assert np.array_equal(s.permutation(2, 1234, 999), whole[1234:1234 + 999])


def test_same_seed_same_order_new_epoch_or_seed_new_order():
    a = sampler(5000, seed=7).permutation(0, 0, 5000)
    assert np.array_equal(a, sampler(5000, seed=7).permutation(0, 0, 5000))
    assert not np.array_equal(a, sampler(5000, seed=7).permutation(1, 0, 5000))
    assert not np.array_equal(a, sampler(5000, seed=8).permutation(0, 0, 5000))


def test_first_positions_are_uniform_over_seeds():
    # Chi-square over 20 bins of where position 0 and position 1 land, across 4000 seeds.
    n, seeds, bins = 1000, 4000, 20
    first = np.array([sampler(n, seed=s).permutation(0, 0, 2) for s in range(seeds)])
    for column in range(2):
        counts = np.bincount(first[:, column] * bins // n, minlength=bins)
        expected = seeds / bins
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert chi2 < 43.8, (column, counts)  # p = 0.001 for 19 degrees of freedom


def test_no_structure_between_neighbours():
    n = 1 << 16
    p = sampler(n, seed=3).permutation(0, 0, n).astype(np.float64)
    # Consecutive outputs are uncorrelated and rarely adjacent.
    assert abs(np.corrcoef(p[:-1], p[1:])[0, 1]) < 0.02
    assert np.mean(np.abs(np.diff(p)) == 1) < 0.001
    # Positions and values are uncorrelated.
    assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.02


def test_block_order_keeps_blocks_together():
    n, block = 10_000, 100
    p = sampler(n, order="block", block=block, seed=1).permutation(0, 0, n)
    # Each run of `block` positions (away from the short block) comes from one block.
    blocks = p // block
    same = np.mean(blocks[1:] == blocks[:-1])
    assert same > 0.95
    assert not np.array_equal(np.unique(blocks[::block]), blocks[::block])  # blocks shuffled


CASES = [
    # (n, batch, world, even, drop_last)
    (n, b, w, even, dl)
    for n, b, w in [(100, 8, 1), (100, 8, 3), (17, 4, 4), (3, 2, 5), (5, 16, 2), (64, 8, 4), (1, 1, 3), (1000, 7, 6)]
    for even in ("pad", "drop", "mask")
    for dl in (False, True)
]


@pytest.mark.parametrize("n,b,w,even,drop_last", CASES)
def test_batches_follow_the_contract(n, b, w, even, drop_last):
    perm = sampler(n, seed=11).permutation(4, 0, n)
    counts = set()
    seen = []
    for r in range(w):
        s = _C.Sampler(n, b, w, r, 11, True, "random", even, drop_last)
        ref = reference_batches(perm, b, w, r, even, drop_last)
        assert s.num_batches(4) == len(ref)
        counts.add(len(ref))
        for step, (ids, valid) in enumerate(ref):
            got_ids, got_valid = s.batch_ids(4, 0, step)
            assert np.array_equal(got_ids, ids)
            assert np.array_equal(got_valid, valid)
            seen.append(ids[valid])
        plan = s.plan(4)
        assert np.array_equal(plan, np.concatenate([i for i, _ in ref]) if ref else np.zeros(0, np.int64))
    assert len(counts) == 1  # every rank has the same number of batches
    seen = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    assert len(np.unique(seen)) == len(seen)  # ranks are disjoint (padding aside)
    if not drop_last:
        if even == "drop":
            assert len(seen) == n // w * w
        else:
            assert np.array_equal(np.sort(seen), np.arange(n))  # full coverage


@pytest.mark.parametrize("even", ["pad", "drop", "mask"])
@pytest.mark.parametrize("w_before,b_before,w_after,b_after", [(4, 4, 2, 8), (2, 8, 4, 4), (3, 4, 3, 4), (2, 6, 2, 5)])
def test_resume_position_follows_the_new_world(even, w_before, b_before, w_after, b_after):
    n = 203
    perm = sampler(n, seed=2).permutation(0, 0, n)
    k = 3  # global steps done before the interruption
    before = _C.Sampler(n, b_before, w_before, 0, 2, True, "random", even, False)
    start = before.position_after(0, 0, k)
    assert start == k * b_before * w_before
    for r in range(w_after):
        s = _C.Sampler(n, b_after, w_after, r, 2, True, "random", even, False)
        ref = reference_batches(perm, b_after, w_after, r, even, False, start=start)
        assert s.num_batches(0, start) == len(ref)
        for step, (ids, valid) in enumerate(ref):
            got_ids, got_valid = s.batch_ids(0, start, step)
            assert np.array_equal(got_ids, ids) and np.array_equal(got_valid, valid)


def test_billion_samples_cost_no_memory_or_time():
    n = 10**9
    s = sampler(n, b=256, seed=1)
    t = time.perf_counter()
    ids, _ = s.batch_ids(0, 0, 0)
    assert time.perf_counter() - t < 0.05
    assert ids.min() >= 0 and ids.max() < n and len(np.unique(ids)) == 256


def test_first_batch_of_a_billion_sample_loader_is_fast():
    tokens = np.zeros(10**9 + 1, dtype=np.uint8)  # untouched zero pages: no real memory
    loader = fl.Loader(fl.Windows(tokens, length=1, stride=1), batch_size=256, shuffle=True, num_threads=2)
    assert len(loader.dataset) == 10**9 + 1
    timings = []
    for _ in range(5):
        t = time.perf_counter()
        batch = next(iter(loader))
        timings.append(time.perf_counter() - t)
    assert batch["tokens"].shape == (256, 1)
    assert sorted(timings)[2] < 0.010, timings  # median under 10 ms
    loader.close()


@pytest.mark.slow
def test_plan_for_a_billion_samples_on_64_ranks():
    n, w = 10**9, 64
    s = _C.Sampler(n, 512, w, 17, 0, True, "random", "pad", False)
    t = time.perf_counter()
    ids = s.plan(0)
    elapsed = time.perf_counter() - t
    assert len(ids) == -(-n // w)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < n
    assert elapsed < 2.0, elapsed
