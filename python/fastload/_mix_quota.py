"""A mixture's per-step quotas in exact arithmetic: the integers the native schedule
(csrc/core/mix_schedule.h) takes, a pure function of the weights and the global batch.

Global batch G, normalised weights w_j (Fractions): quota Q_j = G*w_j = base_j + f_j with
base_j = floor(Q_j), and R = G - sum(base_j) = sum(f_j) extra samples per step. In fixed point
M = 2**32 each f_j becomes an integer share a_j (largest remainder, ties to the lower index) with
sum(a_j) = R*M exactly, so no float ever decides a sample.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

SCALE = 2**32  # M: the schedule's fixed point


def normalised(weights: Sequence[Fraction]) -> list[Fraction]:
    total = sum(weights, Fraction(0))
    if total <= 0:
        raise ValueError(f"weights must not all be 0, got {[float(w) for w in weights]}")
    return [Fraction(w) / total for w in weights]


def quotas(weights: Sequence[Fraction], global_batch: int) -> tuple[list[int], list[int]]:
    """(base_j, a_j) of every source for this global batch; weights need not be normalised."""
    w = normalised(weights)
    exact = [global_batch * x for x in w]
    base = [math.floor(q) for q in exact]
    extras = global_batch - sum(base)  # = sum of the fractional parts, an integer
    scaled = [(q - b) * SCALE for q, b in zip(exact, base)]
    shares = [math.floor(x) for x in scaled]
    left = extras * SCALE - sum(shares)  # < the number of non-integer scaled parts
    by_remainder = sorted(range(len(w)), key=lambda j: (-(scaled[j] - shares[j]), j))
    for j in by_remainder[:left]:
        shares[j] += 1
    # A source owed extras but rounded to no share would never get one: give it one unit (2**-32
    # of a sample per step), taken from the largest share (lowest index on ties).
    for j in range(len(w)):
        if scaled[j] > 0 and shares[j] == 0:
            k = max(range(len(w)), key=lambda i: (shares[i], -i))
            shares[k] -= 1
            shares[j] += 1
    return base, shares
