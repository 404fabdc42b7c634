"""A brute-force statement of weighted mixtures and step-based sampling, for comparison with the
native schedule and stream plans: it walks every step and builds whole index arrays, which the
real loader never does. Written independently of fastload/_mix_quota.py and core/mix_schedule.cpp
(other formulas where there is a choice)."""
from __future__ import annotations

import sys
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np

M = 2**32
ALPHA = 2654435769
sys.setrecursionlimit(10000)


# ---------------------------------------------------------------- quotas
def ref_quotas(weights: Sequence, global_batch: int) -> tuple[list[int], list[int]]:
    """(base_j, a_j) by the rule: base = floor(G*w), a = largest remainder of frac*M (ties to the
    lower index), then every source owed extras gets at least one unit, taken from the largest."""
    w = [Fraction(x) for x in weights]
    total = sum(w)
    q = [global_batch * x / total for x in w]
    base = [int(x.numerator // x.denominator) for x in q]
    f = [x - b for x, b in zip(q, base)]
    r = global_batch - sum(base)
    exact = [x * M for x in f]
    a = [int(x.numerator // x.denominator) for x in exact]
    rest = [x - y for x, y in zip(exact, a)]
    for _ in range(r * M - sum(a)):
        best = None
        for j in range(len(a)):  # the largest remaining remainder, lowest index first
            if rest[j] > 0 and (best is None or rest[j] > rest[best]):
                best = j
        a[best] += 1
        rest[best] = Fraction(-1)
    for j in range(len(a)):
        if f[j] > 0 and a[j] == 0:
            k = min(range(len(a)), key=lambda i: (-a[i], i))
            a[k] -= 1
            a[j] += 1
    return base, a


# ---------------------------------------------------------------- schedule
def ref_extras(shares: Sequence[int], phase: int, step: int) -> list[int]:
    """e_j(step) from the definition: u + k*M in [F_j, F_j + a_j) for some integer k."""
    u = (step * ALPHA + phase) % M
    out, start = [], 0
    for a in shares:
        hit = any(start <= u + k * M < start + a for k in range(len(shares) + 1))
        out.append(int(hit))
        start += a
    return out


def ref_counts(base: Sequence[int], shares: Sequence[int], phase: int, step: int) -> list[int]:
    return [b + e for b, e in zip(base, ref_extras(shares, phase, step))]


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum_{i<n} floor((a*i + b)/m), by the lattice-point recursion over the rows k = 1..t:
    f(n, m, a, b) = t*n - f(t, a, m, m - b + a - 1) with t = floor((a*(n-1) + b)/m), for a, b < m."""
    if n <= 0:
        return 0
    total = (a // m) * n * (n - 1) // 2 + (b // m) * n
    a, b = a % m, b % m
    if a == 0:
        return total
    t = (a * (n - 1) + b) // m
    return total + t * n - floor_sum(t, a, m, m - b + a - 1)


def ref_extras_before(shares: Sequence[int], phase: int, j: int, steps: int) -> int:
    """E_j(steps) by counting the steps s < steps with ((s*ALPHA + phase) mod M) in source j's arc:
    #{x in [lo, hi)} over the rotation, as a difference of floor sums of the arc's two ends."""
    start = sum(shares[:j]) % M
    a = shares[j]
    if a == 0:
        return 0
    off = (phase - start) % M  # v_s = (s*ALPHA + off) mod M; extra iff v_s < a
    # #{s: v_s < a} = sum_s (floor((x_s + M)/M) - floor((x_s + M - a)/M)), x_s = s*ALPHA + off
    return floor_sum(steps, M, ALPHA, off + M) - floor_sum(steps, M, ALPHA, off + M - a)


# ---------------------------------------------------------------- streams
def ref_stream_batches(lengths: Sequence[int], orderings: Sequence[Callable[[int], np.ndarray]],
                       base: Sequence[int], shares: Sequence[int], phase: int, batch_size: int,
                       replicas: int, rank: int, first_step: int, end_step: int,
                       origin: int = 0, base_positions: Sequence[int] | None = None,
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's batches of global steps [first_step, end_step) as (global ids, source index),
    walking every step from the origin. orderings[j](epoch) is source j's whole order that epoch."""
    n = len(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pos = list(base_positions) if base_positions is not None else [0] * n
    cache: dict[tuple[int, int], np.ndarray] = {}

    def sample(j: int, p: int) -> int:
        e = p // lengths[j]
        if (j, e) not in cache:
            cache[(j, e)] = np.asarray(orderings[j](e))
        return int(cache[(j, e)][p % lengths[j]])

    out = []
    for step in range(origin, end_step):
        d = ref_counts(base, shares, phase, step - origin)
        assert sum(d) == batch_size * replicas
        if step >= first_step:
            # the global batch: sources end to end, in source order
            glob_ids, glob_src = [], []
            for j in range(n):
                for t in range(d[j]):
                    glob_ids.append(int(offsets[j]) + sample(j, pos[j] + t))
                    glob_src.append(j)
            rows = [k * replicas + rank for k in range(batch_size)]  # round-robin deal
            out.append((np.array([glob_ids[q] for q in rows], np.int64), np.array([glob_src[q] for q in rows], np.int64)))
        for j in range(n):
            pos[j] += d[j]
    return out
