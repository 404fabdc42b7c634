"""The mixture schedule: exact quotas (fastload/_mix_quota.py) and the native per-step counts
(fastload._C.MixSchedule) against the brute-force reference (tests/mix_reference.py), as
property tests over many weight sets."""
from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import _C
from fastload._mix_quota import SCALE, quotas

import mix_reference as ref

weight_lists = st.lists(st.one_of(st.integers(0, 1000), st.fractions(0, 10), st.floats(0, 1e6, allow_nan=False)),
                        min_size=1, max_size=7).filter(lambda w: sum(Fraction(x) for x in w) > 0)


def schedule(weights, g: int, seed: int = 0):
    base, shares = quotas([Fraction(x) for x in weights], g)
    return base, shares, _C.MixSchedule(g, base, shares, _C.mix_phase(seed))


def test_constants_are_the_design_ones():
    assert _C.MIX_SCALE == SCALE == ref.M == 2**32
    assert _C.MIX_ROTATION == ref.ALPHA == 2654435769


@settings(max_examples=300, deadline=None)
@given(weight_lists, st.integers(1, 2000))
def test_quotas_are_exact(weights, g):
    base, shares = quotas([Fraction(x) for x in weights], g)
    assert (base, shares) == ref.ref_quotas(weights, g)
    total = sum(Fraction(x) for x in weights)
    exact = [g * Fraction(x) / total for x in weights]
    assert base == [math.floor(q) for q in exact]
    extras = g - sum(base)
    assert sum(shares) == extras * SCALE
    for q, b, a in zip(exact, base, shares):
        assert 0 <= a <= SCALE
        assert (a == 0) == (q == b)  # a share exactly where the quota is fractional
        assert abs(Fraction(a, SCALE) - (q - b)) <= Fraction(len(weights), SCALE)


@settings(max_examples=150, deadline=None)
@given(weight_lists, st.integers(1, 600), st.integers(0, 2**64 - 1), st.integers(0, 10**12))
def test_every_step_holds_each_share_within_one_sample(weights, g, seed, far):
    base, shares, s = schedule(weights, g, seed)
    phase = _C.mix_phase(seed)
    total = sum(Fraction(x) for x in weights)
    exact = [g * Fraction(x) / total for x in weights]
    for step in list(range(40)) + [far + k for k in range(40)]:
        d = s.counts(step)
        assert d == ref.ref_counts(base, shares, phase, step)
        assert sum(d) == g
        for dj, q in zip(d, exact):
            assert dj in (math.floor(q), math.ceil(q))
            assert abs(dj - q) < 1


@settings(max_examples=100, deadline=None)
@given(weight_lists, st.integers(1, 300), st.integers(0, 2**64 - 1))
def test_cumulative_extras_match_step_by_step_and_the_reference_floor_sums(weights, g, seed):
    base, shares, s = schedule(weights, g, seed)
    phase = _C.mix_phase(seed)
    running = [0] * len(weights)
    for step in range(120):
        for j in range(len(weights)):
            assert s.extras_before(j, step) == running[j]
            assert s.taken(j, step) == step * base[j] + running[j]
        running = [r + e for r, e in zip(running, ref.ref_extras(shares, phase, step))]
    rng = random.Random(seed)
    for _ in range(5):
        far = rng.randrange(10**12)
        for j in range(len(weights)):
            assert s.extras_before(j, far) == ref.ref_extras_before(shares, phase, j, far)


def test_reference_floor_sum_is_the_sum():
    rng = random.Random(3)
    for _ in range(400):
        n, m = rng.randrange(60), rng.randrange(1, 50)
        a, b = rng.randrange(3 * m), rng.randrange(3 * m)
        assert ref.floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


def test_long_runs_stay_within_a_few_samples_of_the_exact_share():
    # The rotation keeps a source within a few samples of steps * a_j / M however long the run;
    # a_j is f_j rounded to 2**-32, which adds at most steps * 2**-32 samples against the exact share.
    for weights, g in [([6, 3, 1], 64), ([1, 1, 1], 10), ([0.5, 0.25, 0.125, 0.125], 7), ([1, 1000], 3)]:
        base, shares, s = schedule(weights, g, 1)
        total = sum(Fraction(x) for x in weights)
        for steps in (10**6, 10**9, 10**12):
            for j, w in enumerate(weights):
                assert abs(s.taken(j, steps) - steps * (base[j] + Fraction(shares[j], SCALE))) < 40, (weights, g, j)
                expected = steps * g * Fraction(w) / total
                assert abs(s.taken(j, steps) - expected) < 40 + Fraction(steps, SCALE), (weights, g, steps, j)


def test_schedule_input_is_checked():
    with pytest.raises(ValueError, match="do not add up"):
        _C.MixSchedule(10, [3, 3], [0, 0], 0)
    with pytest.raises(ValueError, match="phase"):
        _C.MixSchedule(10, [5, 5], [0, 0], 2**32)
    with pytest.raises(ValueError, match="weights must not all be 0"):
        quotas([Fraction(0), Fraction(0)], 8)
